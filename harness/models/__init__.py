"""The tiny local models offline runs use: random-weight builders, the trained ones, and their build cache."""
