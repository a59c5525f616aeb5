"""Calendar helpers for the billing service: leap years, month lengths, day of the year."""

MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year: int) -> bool:
    """Return True when `year` is a leap year in the Gregorian calendar.

    Years divisible by 4 are leap years, except years divisible by 100, which are leap years only when they
    are also divisible by 400: 2000 was a leap year, 1900 was not.
    """
    return year % 4 == 0


def days_in_month(year: int, month: int) -> int:
    """Number of days in `month` (1-12) of `year`."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be 1-12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def day_of_year(year: int, month: int, day: int) -> int:
    """1 for January 1st, up to 365 or 366 for December 31st."""
    return sum(days_in_month(year, m) for m in range(1, month)) + day
