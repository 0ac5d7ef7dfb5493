"""Run independent timed trials in parallel lanes, each lane owning its own server.

Most of a detection-lag trial is spent waiting for a pod-ready moment, so
lanes run concurrently to keep the full suite within minutes; each lane has
its own test server so that one lane's requests never show in another's
request log.
"""
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Sequence, Tuple, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_lanes(lanes: Sequence[Callable[[], List[R]]]) -> List[R]:
    """Run every lane in its own thread; return all their results (lane order). Re-raises a lane's error."""
    with ThreadPoolExecutor(max_workers=max(1, len(lanes)), thread_name_prefix="bench-lane") as pool:
        futures = [pool.submit(lane) for lane in lanes]
        results: List[R] = []
        for future in futures:
            results.extend(future.result())
    return results


def deal(items: Sequence[T], lanes: int) -> List[List[T]]:
    """Split ``items`` round-robin into ``lanes`` lists."""
    return [list(items[i::lanes]) for i in range(lanes)]


def delays(count: int, low: float, high: float, seed: int) -> List[float]:
    """``count`` pod-ready delays spread evenly over [low, high], shuffled reproducibly.

    Evenly spread rather than random so every part of the range (and hence
    every part of a poll schedule) is sampled, whatever ``count``.
    """
    if count == 1:
        values = [(low + high) / 2.0]
    else:
        values = [low + (high - low) * i / (count - 1) for i in range(count)]
    random.Random(seed).shuffle(values)
    return [round(v, 3) for v in values]


def pairs(values: Sequence[float], clients: Sequence[str]) -> List[Tuple[str, float]]:
    """Every client with every value: both sides of a comparison see the same delays."""
    return [(client, value) for value in values for client in clients]
