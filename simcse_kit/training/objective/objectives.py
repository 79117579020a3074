"""Training objectives: a batch of views in, one contrastive loss out.

:class:`SimCSEObjective` states each mode's contrastive problem as data (anchors,
candidates, one positive column per anchor, an exclusion mask, a logit bias) and hands
it to :func:`simcse_kit.core.losses.contrastive_loss`. Which row is which view comes from
:mod:`simcse_kit.core.batch`. The objective is split in two on purpose: :meth:`~SimCSEObjective.embed`
runs the encoder and :meth:`~SimCSEObjective.loss` only touches the loss core, so
GradCache and the momentum queue work on that seam without knowing the model.

Who is contrasted with whom in each mode is :mod:`simcse_kit.core.modes`' table; the loss reads
it and has no per-mode branch. A loss is built from the parts of :mod:`simcse_kit.training.objective.parts`:
the problem (:meth:`~SimCSEObjective.problem`), the negative filters in order
(:attr:`~SimCSEObjective.filters`, which return what they drop; the objective keeps the
counts) and the weighted terms (:attr:`~SimCSEObjective.terms`, :attr:`~SimCSEObjective.side`).
The objective is also the plain *step* of the step contract
(:mod:`simcse_kit.training.engine.steps`), where GradCache and the momentum queue wrap it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from simcse_kit.core import distributed, losses, masks, modes, quantization, score_losses
from simcse_kit.core.batch import model_inputs, split_views, views_per_example
from simcse_kit.training.engine.steps import Backward, Batch, Queue, backpropagate
from simcse_kit.training.objective.parts import (
    GuideFilter,
    LossSettings,
    NegativeFilter,
    Problem,
    SameText,
    Term,
    TooSimilar,
    drop_negatives,
)

__all__ = ["GuideFilter", "SimCSEObjective", "Tally", "TeacherTargets"]


@dataclass
class TeacherTargets:
    """A teacher's part of the loss (``loss.teacher``; :mod:`simcse_kit.training.objective.teacher` builds the table).

    Attributes:
        vectors: ``[U, D']`` the teacher's vectors of the distinct training sentences; a
            batch's ``teacher_rows`` ``[B]`` index it.
        kind: ``"similarity"``: the student's in-batch softmax matched to the teacher's
            (soft targets, any widths); ``"embedding"``: MSE between L2-normalised student
            and teacher vectors (sentence-transformers' distillation), equal widths or with
            ``projection``.
        temperature: the teacher's own tau for ``similarity``.
        weight: the loss is ``(1 - weight) * SimCSE + weight * teacher term``.
        student_temperature: the student's tau in the ``similarity`` term (None: the
            SimCSE term's ``loss.temperature``). Its own knob so a distribution matched at a
            flat temperature leaves a SimCSE term mixed in at its sharp one.
        projection: ``(mean [D'], components [D', D])`` mapping a wider teacher to the
            student's width for ``embedding`` (:func:`simcse_kit.training.objective.teacher.pca_projection`), or
            ``(mean, components, offset [D])`` into the student's own coordinates
            (:func:`simcse_kit.training.objective.teacher.aligned_projection`).
    """

    vectors: torch.Tensor
    kind: str = "similarity"
    temperature: float = 0.05
    weight: float = 1.0
    projection: tuple[torch.Tensor, ...] | None = None
    student_temperature: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in modes.TEACHER_LOSSES:
            raise ValueError(f"teacher loss must be one of {modes.TEACHER_LOSSES}, got {self.kind!r}")

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The teacher's vectors of table rows ``index`` ``[K]``: ``[K, D']`` fp32 on its device."""
        if self.vectors.device != index.device:  # moved once, to the training device
            self.vectors = self.vectors.to(index.device)
            if self.projection is not None:
                self.projection = tuple(t.to(index.device) for t in self.projection)
        return self.vectors[index].float()

    def embedding_loss(self, embeddings: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """MSE of ``[B, D]`` student rows against their (projected) teacher vectors, both
        L2-normalised so only directions are matched, mean over all entries (as
        sentence-transformers' ``MSELoss``)."""
        target = self.rows(index)
        if self.projection is not None:
            mean, components, *offset = self.projection  # an aligned projection adds the student's mean
            target = (target - mean) @ components + (offset[0] if offset else 0.0)
        if target.shape[1] != embeddings.shape[1]:
            raise ValueError(
                f"embedding distillation needs equal widths: student {embeddings.shape[1]}, teacher {target.shape[1]}; "
                "set loss.teacher_projection: pca, or use loss.teacher_loss: similarity"
            )
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return F.mse_loss(F.normalize(embeddings.float(), dim=-1), F.normalize(target, dim=-1))


@dataclass
class Tally:
    """Masked (anchor, candidate) entries: in the latest batch and over all batches so far.

    Kept as device tensors (or 0): reading a count back every step would stall a GPU; the
    properties read them where they are reported (log steps, the run's end).
    """

    _last: torch.Tensor | int = 0
    _total: torch.Tensor | int = 0

    def add(self, entries: torch.Tensor | int, same_batch: bool = False) -> None:
        """Count ``entries`` (a device tensor is added on the device, not read back): a new
        batch's, or with ``same_batch`` more of the latest batch's (a second mask)."""
        self._last = self._last + entries if same_batch else entries
        self._total = self._total + entries

    @property
    def last(self) -> int:
        return int(self._last)

    @property
    def total(self) -> int:
        return int(self._total)


def _cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    # One block stays the very tensor (no copy): the unsup loss sees what it always saw.
    return parts[0] if len(parts) == 1 else torch.cat(list(parts))


@dataclass
class SimCSEObjective:
    """The SimCSE losses on the example-major rows of :mod:`simcse_kit.core.batch`.

    The mode's :class:`~simcse_kit.core.modes.Contrast` (``loss.unsup_loss`` picks unsup's
    form) says which rows are anchors and which candidates (``N`` local examples, ``W``
    processes when ``loss.gather``; every anchor's candidates also take the queue's ``Q``
    rows when a queue is given):

      * every row an anchor (unsup, ``"views"``): 2N-view NT-Xent against all ``2NW``
        rows; positive: the other view (row ``i ^ 1``); the row itself excluded;
      * view-0 anchors (unsup ``"paper"``, sup, hardneg): against the candidate views'
        rows, block after block (``NW`` rows each); positive: the anchor's own row in
        the first block; the weighted views' own rows (hardneg's ``k`` contradictions,
        ``negatives``) enter with ``loss.hard_negative_weight`` (``log(alpha)`` on those
        logits); every other example's negatives are plain in-batch negatives.

    With ``loss.mask_false_negatives`` the batch's ``text_ids`` drop candidates that
    share a text with the anchor or its positive (:func:`masks.false_negative_mask`);
    with ``loss.false_negative_threshold`` candidates whose cosine with the anchor exceeds
    it are dropped too (:func:`masks.similar_candidate_mask`); the positive never is.
    :attr:`masked_negatives` counts them over all calls, :attr:`last_masked` in the latest.
    With a ``guide`` (:class:`GuideFilter`) every candidate (in-batch rows of every process,
    hard negatives, the queue's rows) that the guide rates above the anchor's positive, less
    the margin, is dropped too (:func:`masks.guided_mask`, GISTEmbed's rule); the batch's
    ``guide_rows`` and the queue's say which of the guide's vectors each row is.
    :attr:`guided` counts the (anchor, candidate) entries the guide drops, whether or not
    another rule dropped them too.

    With a ``teacher`` (:class:`TeacherTargets`) the loss is ``(1 - w) * SimCSE + w * T``.
    For ``similarity``, ``T`` is the soft-target form of the same call: the same anchors,
    the same in-batch candidates (gathered across processes) and the same exclusions
    (self, false negatives), with the teacher's softmax over those candidates as the
    target instead of a one-hot positive; the queue's rows and the hard-negative weight
    belong to the SimCSE term only (the teacher has no vectors of the queue's keys, and
    its distribution already says how hard each negative is).
    With ``loss.matryoshka_dims`` the loss is the weighted sum of the same problem on each
    prefix of the rows (:func:`losses.matryoshka_loss`); a function of the full
    embeddings still, so GradCache and the queue take it as they take the plain loss.
    With ``loss.quantization`` the same problem on the straight-through int8 or binary codes
    of the same rows is added at ``loss.quantization_weight`` (:meth:`quantized_loss`).

    With ``loss.distill`` (``hardneg`` rows carrying a teacher's scores of their positive
    and negatives) the loss is ``(1 - w) * contrastive + w * D``, ``D`` each anchor's
    cosines with its own candidates against the teacher's scores (:meth:`distill_loss`).
    """

    mode: str
    loss_cfg: LossSettings
    teacher: TeacherTargets | None = None
    negatives: int = 1
    """``k``, hard negatives per example (``hardneg``): ``V = 2 + k`` views, each negative a block."""
    guide: GuideFilter | None = None
    masked: Tally = field(default_factory=Tally, compare=False, repr=False)
    """Entries masked by text or by the student's similarity."""
    guided: Tally = field(default_factory=Tally, compare=False, repr=False)
    """Entries masked by the guide."""
    last_terms: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)
    filters: list[NegativeFilter] = field(init=False, compare=False, repr=False)
    """The negative filters, in order: by text, by the student's similarity, by the guide."""
    terms: list[Term] = field(init=False, compare=False, repr=False)
    """The terms joined to the contrastive loss of the rows, in order: the quantized codes', a teacher's."""
    side: Term | None = field(init=False, compare=False, repr=False)
    """The term beside the whole contrastive loss: a scored mode's or ``loss.distill``'s."""

    def __post_init__(self) -> None:
        views_per_example(self.mode, self.negatives)  # an unknown mode (or k for one without negatives) fails here
        cfg = self.loss_cfg
        if cfg.distill is not None and self.mode != modes.NEGATIVES_MODE:
            raise ValueError(f"loss.distill needs each row's hard negatives (mode hardneg); mode is {self.mode!r}")
        self.filters = [SameText()] if cfg.mask_false_negatives else []
        self.filters += [TooSimilar(cfg.false_negative_threshold)] if cfg.false_negative_threshold is not None else []
        self.filters += [self.guide] if self.guide is not None else []
        self.terms = []
        if cfg.quantization is not None:
            self.terms.append(Term("quantized_loss", cfg.quantization_weight, self.quantized_loss, "float_loss", mixed=False))
        if self.teacher is not None:
            self.terms.append(Term("teacher_loss", self.teacher.weight, self.teacher_term, "simcse_loss"))
        self.side = None
        if modes.mode(self.mode).score_column is not None:
            self.side = Term("score_loss", cfg.score_weight, self.score_loss, "infonce_loss")
        elif cfg.distill is not None:
            self.side = Term("distill_loss", cfg.distill_weight, self.distill_loss, "infonce_loss")
        if cfg.quantization is not None and self.side is not None and self.side.weight == 1:
            raise ValueError(f"loss.quantization trains the contrastive term, and {self.side.name} at weight 1 leaves none")

    def views_per_example(self) -> int:
        """``V``: rows per example in this mode's batches."""
        return views_per_example(self.mode, self.negatives)

    def of(self, batch: Batch | None = None) -> SimCSEObjective:
        """The objective of ``batch``: this one (a run's objective holds one per dataset,
        :class:`~simcse_kit.training.objective.mixture.MixtureObjective`)."""
        return self

    def metrics(self) -> dict[str, float]:
        """The counters a tracked run logs (:mod:`simcse_kit.training.engine.tracking`): with false-negative
        masking, the entries masked in the latest batch and in all batches so far."""
        out = {name: float(value) for name, value in self.last_terms.items()}
        if self.masking:
            out |= {"masked_negatives": float(self.masked.last), "masked_negatives_total": float(self.masked.total)}
        if self.guide is not None:
            out |= {"guide_masked": float(self.guided.last), "guide_masked_total": float(self.guided.total)}
        return out

    @property
    def masking(self) -> bool:
        """True when some negatives may be masked (by text or by similarity)."""
        return self.loss_cfg.mask_false_negatives or self.loss_cfg.false_negative_threshold is not None

    @property
    def all_rows(self) -> bool:
        """Every row is an anchor (unsup's 2N-view form)."""
        return self.contrast.all_rows

    @property
    def contrast(self) -> modes.Contrast:
        """Who is contrasted with whom: the mode's row of :data:`simcse_kit.core.modes.TABLE`."""
        return modes.contrast(self.mode, self.loss_cfg.unsup_loss, self.negatives)

    def views(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Per-row values (embeddings ``[B, H]``, text ids or teacher rows ``[B]``) split
        into the anchors' ``[N, ...]`` and the candidate blocks', by :attr:`contrast`.

        Strided views of ``rows`` (no copy), so gradients flow back to it.
        """
        form = self.contrast
        if form.anchor_view is None:  # every row anchors, against all rows in batch order
            return rows, [rows]
        by_view = split_views(rows, self.views_per_example())
        return by_view[form.anchor_view], [by_view[v] for v in form.candidate_views]

    def embed(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Encode every row of a tokenised batch: ``[B, H]``; non-model keys are ignored."""
        return model(**model_inputs(batch))

    def loss(self, embeddings: torch.Tensor, batch: Batch | None = None, queue: Queue | None = None) -> torch.Tensor:
        """The loss of a batch's embeddings ``[B, H]`` (rows in batch order): the contrastive
        loss (:meth:`contrastive_loss`), and with a :attr:`side` term (a scored mode's score
        loss, ``loss.distill``'s term) ``(1 - w) * contrastive + w * term`` (the term alone
        at ``w = 1``).

        A function of the full batch's embeddings, so GradCache (which calls it on the
        cached ``[B, H]``) and several processes (which gather inside it) take either term.

        Args:
            embeddings: ``[N*V, H]``, example-major.
            batch: the collated batch (``text_ids``, ``teacher_rows``, ``scores``,
                ``teacher_scores`` where needed).
            queue: optional extra negatives of the contrastive term, ``([Q, H], [Q] text ids)``.
        """
        side = self.side
        if side is None or not side.weight:
            return self.contrastive_loss(embeddings, batch, queue)
        value = side.fn(embeddings, batch)
        if side.weight == 1:  # the side term alone: no InfoNCE graph is built
            self.last_terms = {side.name: value.detach()}
            return value
        self.last_terms = {}
        contrastive = self.contrastive_loss(embeddings, batch, queue)
        self.last_terms = self.last_terms | {side.rest: contrastive.detach(), side.name: value.detach()}
        return side.join(contrastive, value)

    def distill_loss(self, embeddings: torch.Tensor, batch: Batch | None) -> torch.Tensor:
        """The teacher-score term (``loss.distill``): each anchor's cosines with its *own*
        candidates (its positive, then its ``k`` hard negatives) against the teacher's
        scores of them, the batch's ``teacher_scores`` ``[N, 1 + k]``.

        ``kl``: :func:`score_losses.kl_distillation_loss` of the student's softmax at
        ``loss.distill_student_temperature`` (default ``loss.temperature``) against the
        teacher's at ``loss.distill_teacher_temperature``; ``margin_mse``:
        :func:`score_losses.margin_mse_loss` of the margins ``positive - negative``. A mean
        over anchors (pairs), as each function's.

        Local on purpose: an anchor's candidates are its own example's rows, which live on
        its process with their scores, so nothing is gathered; DDP's mean of the processes'
        equal-sized means is the global mean. With ``loss.matryoshka_dims``, the weighted
        sum over the prefixes, as the contrastive term.

        Args:
            embeddings: ``[N*V, H]``, example-major (``V = 2 + k``).
            batch: holds ``teacher_scores`` ``[N, 1 + k]`` (the collator's, one row per example).
        """
        if batch is None or "teacher_scores" not in batch:
            raise ValueError("loss.distill needs the batch's teacher_scores (ContrastiveCollator(teacher_scores=True))")
        anchors, *others = split_views(embeddings, self.views_per_example())
        candidates = torch.stack(others, dim=1)  # [N, 1 + k, H]: the positive, then the k negatives
        teacher = batch["teacher_scores"].to(embeddings.device)
        if teacher.shape != candidates.shape[:2]:
            raise ValueError(f"teacher_scores has shape {tuple(teacher.shape)}; the batch needs {tuple(candidates.shape[:2])}")
        cfg = self.loss_cfg
        tau = cfg.temperature if cfg.distill_student_temperature is None else cfg.distill_student_temperature

        def term(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            student = score_losses.candidate_cosines(a, c)
            if cfg.distill == "margin_mse":
                return score_losses.margin_mse_loss(student, teacher)
            return score_losses.kl_distillation_loss(
                student, teacher, student_temperature=tau, teacher_temperature=cfg.distill_teacher_temperature
            )

        return self.over_prefixes(term, anchors, candidates)

    def over_prefixes(
        self, term: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], first: torch.Tensor, second: torch.Tensor
    ) -> torch.Tensor:
        """``term(first, second)``, or with ``loss.matryoshka_dims`` the weighted sum of it
        on each prefix of the embeddings' last axis (each re-normalised by the term's cosines)."""
        dims, weights = self.loss_cfg.matryoshka_dims, self.loss_cfg.matryoshka_weights
        if dims is None:
            return term(first, second)
        weights = [1.0] * len(dims) if weights is None else weights
        if any(not 1 <= d <= first.shape[-1] for d in dims):
            raise ValueError(f"Matryoshka dims {list(dims)} must lie in 1..{first.shape[-1]} (the embedding size)")
        return torch.stack([w * term(first[..., :d], second[..., :d]) for d, w in zip(dims, weights, strict=True)]).sum()

    def score_loss(self, embeddings: torch.Tensor, batch: Batch | None) -> torch.Tensor:
        """The score-ranking loss (``loss.score_loss`` of :data:`simcse_kit.core.score_losses.SCORE_LOSSES`,
        at ``loss.score_scale``) of the pairs ``(view 0, view 1)`` under the batch's ``scores``.

        With ``loss.gather`` every process ranks all processes' pairs (gathered with
        gradient, :func:`distributed.gather_with_grad`): the loss ranks every couple of
        pairs of the global batch, not only each process's, and DDP's mean of the equal
        per-process losses is that global loss. With ``loss.matryoshka_dims``, the weighted
        sum over the prefixes, as the contrastive term.

        Args:
            embeddings: ``[N*V, H]``, example-major.
            batch: holds ``scores`` ``[N]`` (the collator's, one per example).
        """
        if batch is None or "scores" not in batch:
            raise ValueError(f"mode {self.mode!r} needs the batch's scores (ContrastiveCollator adds them)")
        views = split_views(embeddings, self.views_per_example())
        scores = batch["scores"].to(embeddings.device)
        if scores.shape != (views[0].shape[0],):
            raise ValueError(f"scores has shape {tuple(scores.shape)}; the batch has {views[0].shape[0]} pairs")
        first, second, scores = self.gather(views[0])[0], self.gather(views[1])[0], self.gather(scores)[0]
        rank = score_losses.SCORE_LOSSES[self.loss_cfg.score_loss]
        return self.over_prefixes(lambda a, b: rank(a, b, scores, scale=self.loss_cfg.score_scale), first, second)

    def contrastive_loss(self, embeddings: torch.Tensor, batch: Batch | None = None, queue: Queue | None = None) -> torch.Tensor:
        """The contrastive loss of a batch's embeddings ``[B, H]`` (rows in batch order).

        Args:
            embeddings: ``[N*V, H]``, example-major.
            batch: the collated batch; its ``text_ids`` ``[B]`` are needed with
                ``loss.mask_false_negatives``.
            queue: optional extra negatives of every anchor (:class:`~simcse_kit.training.engine.steps.Queue`).
        """
        problem = self.problem(embeddings, queue)
        dropped, gained = drop_negatives(self.filters, problem, self, batch, queue)
        if "masked" in gained:  # the filters return what they dropped; the tallies are kept here
            self.masked.add(gained["masked"])
        if "guided" in gained:
            self.guided.add(gained["guided"])
        exclude = problem.exclusions(dropped)
        loss = self.prefix_loss(
            problem.anchors, problem.candidates, positive_index=problem.positive, exclude=exclude, logit_bias=problem.bias
        )
        for term in self.terms:
            value = term.fn(problem, exclude, embeddings, batch)
            self.last_terms = self.last_terms | {term.rest: loss.detach(), term.name: value.detach()}
            loss = term.join(loss, value)
        return loss

    def problem(self, embeddings: torch.Tensor, queue: Queue | None = None) -> Problem:
        """The contrastive problem of a batch's embeddings ``[B, H]``, as :attr:`contrast`
        states it: the anchors and every process's candidate blocks (gathered with gradient),
        then the queue's rows; each anchor's positive and own column; the hard negatives'
        bias, ``log(loss.hard_negative_weight)`` on each anchor's own rows of the weighted
        blocks, whole blocks after its positive."""
        form = self.contrast
        anchors, blocks = self.views(embeddings)
        # Gather: all processes' candidates, with gradient; the local rows start at offset.
        gathered = [self.gather(block) for block in blocks]
        offset, block_rows = gathered[0][1], gathered[0][0].shape[0]
        candidates = _cat([rows for rows, _ in gathered])
        in_batch = candidates.shape[0]  # the queue's rows, if any, come after these
        if queue is not None:  # the queue: negatives of every anchor, after the in-batch ones
            candidates = torch.cat([candidates, queue[0].to(candidates.dtype)])
        n, m, device = anchors.shape[0], candidates.shape[0], anchors.device
        local = torch.arange(n, device=device) + offset  # the anchors' own rows (or examples) among the gathered
        positive = masks.view_labels(n, offset, device) if form.all_rows else local
        itself = local if form.all_rows else None  # an anchor among its own candidates
        bias, weighted, alpha = None, form.weighted_blocks, self.loss_cfg.hard_negative_weight
        if len(weighted) == 1:  # one hard negative: its column alone ([N]), as ever
            bias = masks.weight_bias(positive + weighted[0] * block_rows, m, alpha, anchors)
        elif weighted:  # k hard negatives: anchor i's k own rows, [N, k]
            # Offsets added as Python ints: a tensor of them would be a host-to-device copy each step.
            columns = torch.stack([positive + block * block_rows for block in weighted], dim=1)
            bias = masks.weight_bias(columns, m, alpha, anchors)
        return Problem(anchors, candidates, positive, itself, offset, block_rows, in_batch, embeddings.shape[0], bias)

    def teacher_term(
        self, problem: Problem, exclude: torch.Tensor | None, embeddings: torch.Tensor, batch: Batch | None
    ) -> torch.Tensor:
        """The teacher :class:`Term`: :meth:`teacher_loss` on the problem's in-batch candidates."""
        in_batch = problem.in_batch
        in_batch_exclude = None if exclude is None else exclude[:, :in_batch]
        return self.teacher_loss(
            embeddings, problem.anchors, problem.candidates[:in_batch], problem.positive, in_batch_exclude, batch
        )

    def teacher_loss(
        self,
        embeddings: torch.Tensor,
        anchors: torch.Tensor,
        candidates: torch.Tensor,
        positive: torch.Tensor,
        exclude: torch.Tensor | None,
        batch: Batch | None,
    ) -> torch.Tensor:
        """The teacher term on the same rows the SimCSE term used.

        Args:
            embeddings: ``[B, H]`` all local rows (``embedding`` distillation).
            anchors: ``[N, H]`` the anchors of :meth:`loss`.
            candidates: ``[M, H]`` its in-batch (gathered) candidates.
            positive: ``[N]`` each anchor's positive column (never excluded).
            exclude: ``[N, M]`` or None, its exclusions over those candidates.
            batch: the collated batch, holding ``teacher_rows`` ``[B]``.
        """
        assert self.teacher is not None
        if batch is None or "teacher_rows" not in batch:
            raise ValueError("a teacher needs the batch's teacher_rows (ContrastiveCollator(teacher_index=...))")
        rows = batch["teacher_rows"].to(embeddings.device)
        if self.teacher.kind == "embedding":
            return self.teacher.embedding_loss(embeddings, rows)
        anchor_rows, blocks = self.views(rows)
        candidate_rows = torch.cat([self.gather_ids(block) for block in blocks])
        if exclude is not None:  # as in the SimCSE term, a positive is never excluded
            columns = torch.arange(exclude.shape[1], device=exclude.device)[None, :]
            exclude = exclude & (columns != positive[:, None])  # comparison: no device read-back on CUDA
        teacher_anchors, teacher_candidates = self.teacher.rows(anchor_rows), self.teacher.rows(candidate_rows)
        targets = losses.similarity_targets(
            teacher_anchors, teacher_candidates, temperature=self.teacher.temperature, exclude=exclude
        )
        tau = self.teacher.student_temperature
        return self.prefix_loss(anchors, candidates, target_probs=targets, exclude=exclude, temperature=tau)

    def quantized_loss(
        self, problem: Problem, exclude: torch.Tensor | None, embeddings: torch.Tensor, batch: Batch | None
    ) -> torch.Tensor:
        """The quantized :class:`Term` (``loss.quantization``): the same problem (positives,
        exclusions, bias, every Matryoshka prefix) on the straight-through int8 or binary codes
        of the same rows (:func:`quantization.quantized_contrastive_loss`), added at
        ``loss.quantization_weight``. The candidates are already gathered, so several processes
        and GradCache (which calls :meth:`loss` on the cached rows) take it as the float term;
        int8 ranges are those of the in-batch (gathered, not queued) candidates, the same on
        every process."""
        cfg = self.loss_cfg
        assert cfg.quantization is not None  # the term exists only with it
        ranges = quantization.batch_ranges(problem.candidates[: problem.in_batch]) if cfg.quantization == "int8" else None
        return quantization.quantized_contrastive_loss(
            problem.anchors, problem.candidates, cfg.quantization, ranges=ranges, dims=cfg.matryoshka_dims,
            weights=cfg.matryoshka_weights, temperature=cfg.temperature, positive_index=problem.positive,
            exclude=exclude, logit_bias=problem.bias,
        )  # fmt: skip

    def prefix_loss(
        self, anchors: torch.Tensor, candidates: torch.Tensor, temperature: float | None = None, **problem: torch.Tensor | None
    ) -> torch.Tensor:
        """:func:`losses.contrastive_loss` of ``problem`` (positives or targets, exclusions,
        bias) at ``temperature`` (default ``loss.temperature``), on every Matryoshka prefix
        (``loss.matryoshka_dims``; the full rows without it). Masks are decided once, on the
        full rows, by the caller."""
        cfg = self.loss_cfg
        tau = cfg.temperature if temperature is None else temperature
        dims, weights = cfg.matryoshka_dims, cfg.matryoshka_weights
        return losses.matryoshka_loss(anchors, candidates, dims, weights, temperature=tau, **problem)

    @property
    def masked_negatives(self) -> int:
        """Masked (anchor, candidate) entries over all batches so far (by text or similarity)."""
        return self.masked.total

    @property
    def guided_total(self) -> int:
        """(anchor, candidate) entries the guide dropped over all batches so far."""
        return self.guided.total

    @property
    def last_masked(self) -> int:
        """Masked (anchor, candidate) entries in the latest batch."""
        return self.masked.last

    def row_ids(self, batch: Batch | None, n_rows: int) -> torch.Tensor | None:
        """The batch's ``text_ids`` ``[B]`` when false-negative masking is on, else None."""
        if not self.loss_cfg.mask_false_negatives:
            return None
        if batch is None or "text_ids" not in batch:
            raise ValueError("loss.mask_false_negatives needs the batch's text_ids (ContrastiveCollator(with_text_ids=True))")
        ids = batch["text_ids"]
        if ids.shape[0] != n_rows:
            raise ValueError(f"text_ids has {ids.shape[0]} rows, the embeddings {n_rows}")
        return ids

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """All processes' ``rows`` (with gradient) when ``loss.gather`` is on, and where
        the local ones start; ``(rows, 0)`` on one process."""
        return distributed.gather_with_grad(rows) if self.loss_cfg.gather else (rows, 0)

    def gather_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """All processes' text ids in the order :meth:`gather` gathers rows."""
        return distributed.gather_labels(ids) if self.loss_cfg.gather else ids

    def step(self, model: nn.Module, batch: Batch, backward: Backward | None = None) -> torch.Tensor:
        """The plain step (:mod:`simcse_kit.training.engine.steps`): embed, loss, ``backward(loss)``
        (``loss.backward()`` when None), then the detached loss."""
        return backpropagate(self.loss(self.embed(model, batch), batch), backward)

    __call__ = step
