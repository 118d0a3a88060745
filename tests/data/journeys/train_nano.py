"""A stand-in for nanoGPT's train.py in the recipe journeys (tests/bed/test_journey_recipes.py):
standin.py beside it prints what that trainer prints and keeps its ckpt.pt as it does (one file in
--out_dir, rewritten in place; --init_from=resume loads it); a step takes 2,560 tokens at the speed
of the kernels' wheel build in the venv (fast or slow), as a torch build sets a real trainer's."""

import os
import sys

import demo_kernels

os.environ["STANDIN_INTERVAL"] = str(2560 / demo_kernels.TOKENS_PER_SECOND)
sys.argv[1:1] = ["nanogpt"]
import standin  # noqa: E402,F401 - runs the trainer
