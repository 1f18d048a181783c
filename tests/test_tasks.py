"""Task declarations: the argument check each task works out once from its handler's
signature agrees with Python's own binding.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox.kernel.errors import InvalidArguments


def _handler_a(ctx, n: int, label: str = "x", *, flag: bool = False) -> None: ...


def _handler_b(ctx, n, /, m: int | None = None) -> None: ...


def _handler_c(ctx, n: int, **extra: Any) -> None: ...


def _handler_d(ctx, *more: Any, k: float) -> None: ...


@pytest.mark.parametrize("handler", [_handler_a, _handler_b, _handler_c, _handler_d])
@given(args=st.dictionaries(st.sampled_from(["n", "m", "label", "flag", "k", "extra", "more"]),
                            st.sampled_from([1, "1", 1.5, True, None])))  # fmt: skip
def test_the_precomputed_argument_check_agrees_with_python_binding(handler, args):
    """The consumer checks arguments against a shape worked out once per task; it must refuse
    exactly what calling the handler with those arguments would refuse (and then the scalar
    annotations), no more, no less."""
    from oncebox.jobs.tasks import make_task

    task = make_task(handler, name="t", key=None, retry=None, timeout=60, priority=0,
                     queue="default", group_by=None, keep_intents=None)  # fmt: skip
    try:
        task.signature.bind(**args)
        binds = True
    except TypeError:
        binds = False
    if not binds:
        with pytest.raises(InvalidArguments, match="do not fit"):
            task.check_args(args)
        return
    try:
        task.check_args(args)
    except InvalidArguments as exc:
        assert "must be" in str(exc)  # only a scalar annotation may refuse what binds
