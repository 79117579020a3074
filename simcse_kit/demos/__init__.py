"""Demos and analyses on the loss core: image SupCon, a 2-D toy, temperature, alignment/uniformity."""
