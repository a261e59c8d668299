"""The walk of `clp run` stays a descent: from the composition root (experiments/run.py) through
setup, the base cache and the run folder down into the core, climbing back from `cl_platform` into
`experiments` at most 8 times (the redesign's bar; the walk it replaced climbed back 20 times, 14
of them in the base cache asking the core one primitive at a time).

The walk is traced with `sys.setprofile` over `experiments.run.execute` on a given base, up to the
continual phase (`ContinualRunner.run` raises before training: the walk is the composition, not the
training). Consecutive calls in one module are one stay; a climb is a stay in `experiments.*` right
after one in `cl_platform.*`. Comprehension frames count as calls (Python 3.11 gives them frames).
"""

import sys

LIBRARY = ("cl_platform", "experiments", "streams", "strategies", "analysis")
MOST_CLIMBS = 8


class _Stop(Exception):
    pass


def _walk(config) -> list[tuple[str, str]]:
    from experiments.run import execute

    stays: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith(LIBRARY) and (not stays or stays[-1][0] != module):
            stays.append((module, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        execute(config, progress_bar=False, say=lambda _: None)
    except _Stop:
        pass
    finally:
        sys.setprofile(None)
    return stays


def climbs(stays: list[tuple[str, str]]) -> list[str]:
    return [f"{a[0]}.{a[1]} -> {b[0]}.{b[1]}" for a, b in zip(stays, stays[1:])
            if a[0].startswith("cl_platform") and b[0].startswith("experiments")]


def test_the_walk_of_clp_run_climbs_back_at_most_eight_times(tiny, tiny_base, tmp_path, monkeypatch):
    import cl_platform.engine

    def stop(self, *args, **kwargs):
        raise _Stop

    monkeypatch.setattr(cl_platform.engine.ContinualRunner, "run", stop)
    first, second = (tiny.config(tmp_path / f"walk{i}.yaml", runs_root=str(tmp_path / f"runs{i}"),
                                 base_checkpoint=str(tiny_base.path)) for i in (1, 2))
    _walk(first)  # imports everything first: a module's first import is a call of its own
    stays = _walk(second)
    assert any(m == "experiments.base" for m, _ in stays) and any(m == "cl_platform.run_dir" for m, _ in stays)
    found = climbs(stays)
    assert len(found) <= MOST_CLIMBS, "\n".join(found)


def test_the_climb_count_sees_a_climb():
    # The measure can fail: a walk that goes down and back up twice counts two.
    stays = [("experiments.run", "execute"), ("cl_platform.config", "load"), ("experiments.setup", "x"),
             ("cl_platform.check", "check"), ("streams.scenario", "y"), ("experiments.base", "z")]
    assert climbs(stays) == ["cl_platform.config.load -> experiments.setup.x"]
    stays.insert(5, ("cl_platform.model", "m"))
    assert len(climbs(stays)) == 2
