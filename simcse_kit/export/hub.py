"""Uploading a finished export to the Hugging Face hub."""

from __future__ import annotations

from pathlib import Path


def hub_upload(folder: Path, repo_id: str) -> str:
    """Create (if needed) the hub model repo ``repo_id`` and upload ``folder``; returns its URL."""
    # Imported here: only an upload needs the hub client (and, on import, its network settings).
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model", commit_message="simcse-kit export")
    return f"https://huggingface.co/{repo_id}"
