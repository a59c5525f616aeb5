"""Pagination for the orders list."""


def page_count(total_items: int, per_page: int) -> int:
    """Number of pages needed to show `total_items` items, `per_page` on each page; a last, partly filled page
    counts too, and no items need no pages."""
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return total_items // per_page


def page_bounds(page: int, per_page: int) -> tuple[int, int]:
    """Start (inclusive) and end (exclusive) index of the items on `page`, counting pages from 1."""
    start = (page - 1) * per_page
    return start, start + per_page
