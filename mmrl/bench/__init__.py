"""Benchmarks: run several configurations of the same task and compare them (``mmrl bench ...``)."""

from .algos import VARIANTS, run_algo_bench

__all__ = ["VARIANTS", "run_algo_bench"]
