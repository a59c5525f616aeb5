"""Prices for the checkout."""


def percent_of(amount: float, percent: float) -> float:
    """`percent` percent of `amount`."""
    return amount * percent / 100


def apply_discount(price: float, percent: float) -> float:
    """The price after taking `percent` percent off, rounded to cents."""
    return round(price + percent_of(price, percent), 2)
