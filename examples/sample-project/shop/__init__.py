"""A tiny shop used by the orchestrator demo."""

from .cart import Cart
from .pricing import calc_total

__all__ = ["Cart", "calc_total"]
