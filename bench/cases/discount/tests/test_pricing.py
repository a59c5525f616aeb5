from pricing import apply_discount, percent_of


def test_percent_of():
    assert percent_of(200, 15) == 30


def test_apply_discount():
    assert apply_discount(100, 10) == 90
    assert apply_discount(19.99, 0) == 19.99
    assert apply_discount(80, 25) == 60
