"""eyas: train EAGLE-3 speculative-decoding draft heads (https://github.com/eyas-project/eyas)."""

__version__ = "0.1.0"
