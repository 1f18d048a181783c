from __future__ import annotations

import oncebox


def test_the_public_names_are_sorted_and_all_exist():
    assert oncebox.__all__ == sorted(oncebox.__all__)
    for name in oncebox.__all__:
        assert hasattr(oncebox, name), name


def test_every_error_is_an_oncebox_error():
    errors = [getattr(oncebox, n) for n in oncebox.__all__ if n.endswith(("Error", "Refused"))]
    assert errors and all(issubclass(e, oncebox.OnceboxError) for e in errors)
