"""lockfile.exclusive: a lock whose file its holders remove still admits one holder at a time."""
import os
import threading

import pytest

from flytekitplugins_ddlscale.errors import ConflictError
from flytekitplugins_ddlscale.backends._support.lockfile import exclusive, remove_unused

THREADS = 6
ROUNDS = 40


def _busy() -> ConflictError:
    return ConflictError("the lock stayed busy")


def test_holders_that_remove_the_lock_file_never_overlap(tmp_path):
    path = tmp_path / "x.lock"
    inside, most, errors = [0], [0], []
    guard = threading.Lock()

    def remove() -> None:
        os.unlink(path)

    def worker() -> None:
        try:
            for _ in range(ROUNDS):
                with exclusive(path, 30, _busy, on_release=remove):
                    with guard:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    threading.Event().wait(0.001)
                    with guard:
                        inside[0] -= 1
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and most[0] == 1
    assert not path.exists()


def test_the_wait_is_bounded_and_the_file_of_a_thing_in_use_stays(tmp_path):
    path = tmp_path / "y.lock"
    with exclusive(path, 1, _busy, on_release=lambda: remove_unused(path, lambda: True)):
        with pytest.raises(ConflictError, match="stayed busy"):
            with exclusive(path, 0.2, _busy):
                pass
    assert path.exists()


def test_the_release_tidies_up_after_a_block_that_raised(tmp_path):
    path = tmp_path / "z.lock"
    with pytest.raises(RuntimeError):
        with exclusive(path, 1, _busy, on_release=lambda: remove_unused(path, lambda: False)):
            raise RuntimeError("the block failed")
    assert not path.exists()
