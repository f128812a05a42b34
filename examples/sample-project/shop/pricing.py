"""Prices and totals."""

VAT = 0.2


def calc_total(prices: list[float]) -> float:
    """The total of a list of prices, VAT included."""
    return round(sum(prices) * (1 + VAT), 2)
