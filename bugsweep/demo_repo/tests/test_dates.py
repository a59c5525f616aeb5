import pytest

from dates import day_of_year, days_in_month, is_leap_year


@pytest.mark.parametrize("year", [1996, 2000, 2024, 2400])
def test_leap_years(year):
    assert is_leap_year(year)


@pytest.mark.parametrize("year", [1900, 2023, 2100, 2200])
def test_common_years(year):
    assert not is_leap_year(year)


def test_february_length():
    assert days_in_month(2024, 2) == 29
    assert days_in_month(1900, 2) == 28


def test_day_of_year():
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2000, 12, 31) == 366
    assert day_of_year(2100, 3, 1) == 60
