"""EAGLE-3's torch half: the base draft and TTT's unroll, which live in train/model.py and train/ttt.py
because the other kinds build on them (the models to follow: a diagram, shapes in every signature)."""

from ...model import Eagle3Draft as MODEL
from ...ttt import read_rows as ROWS
from ...ttt import ttt_forward as UNROLL

__all__ = ["MODEL", "ROWS", "UNROLL"]
