"""Stored benchmark figures per machine class and the regression check against them."""
