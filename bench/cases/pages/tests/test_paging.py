from paging import page_bounds, page_count


def test_page_count():
    assert page_count(9, 3) == 3
    assert page_count(10, 3) == 4
    assert page_count(1, 20) == 1
    assert page_count(0, 5) == 0


def test_page_bounds():
    assert page_bounds(1, 10) == (0, 10)
    assert page_bounds(3, 10) == (20, 30)
