"""The shopping cart."""

from .pricing import calc_total


class Cart:
    """Items and their prices."""

    badge_colour = "green"

    def __init__(self) -> None:
        self.items: dict[str, float] = {}

    def add(self, name: str, price: float) -> None:
        self.items[name] = price

    def total(self) -> float:
        return calc_total(list(self.items.values()))
