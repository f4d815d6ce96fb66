"""The ``pileworks`` entry point: the version, user errors (exit 2) and our own failures (exit 1), one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import USAGE_ERRORS
from pipeline.dataset.manifest import DatasetConflictError
from pipeline.errors import ConfigError, PileworksError


def test_cli_reports_a_config_error_with_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("clean:\n  normalisation: NFC\n")
    assert main(["build", "--config", str(bad), "--output", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "clean.normalisation" in err and "known fields of clean" in err
    assert err.startswith("pileworks build: error: bad.yaml: ") and "did you mean clean.normalization?" in err


def test_cli_refuses_a_bad_dataset_name_before_any_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    assert main(["build", "--name", ".hidden", "--output", str(tmp_path / "store")]) == 2
    assert "dataset name '.hidden'" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()  # refused at load: no work folder, no Prefect run


def test_version_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main
    from pipeline import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pileworks {__version__}"


def test_cli_reports_our_own_failures_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main

    (tmp_path / "checkpoints").mkdir()
    assert main(["trace", "--checkpoint", str(tmp_path / "checkpoints"), "--step", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pileworks trace: error:") and "no complete checkpoint" in err
    assert "Traceback" not in err


def _family(cls: type[PileworksError]) -> list[type[PileworksError]]:
    return [cls, *(sub for direct in cls.__subclasses__() for sub in _family(direct))]


# Every member of the family, found by walking the classes (a new subclass is covered without editing this list).
# Config and usage errors exit 2 (tested below); every other member of the family exits 1.
OUR_FAILURES = [c for c in _family(PileworksError) if not issubclass(c, USAGE_ERRORS)]


def test_the_family_holds_the_failures_the_cli_reports() -> None:
    names = {c.__name__ for c in OUR_FAILURES}
    assert {"StorageError", "StageFailed", "CheckpointError", "TrainingFailed", "UnitNotDone"} <= names
    assert DatasetConflictError in OUR_FAILURES  # a subclass defined outside pipeline.errors is found too


@pytest.mark.parametrize("error", OUR_FAILURES, ids=lambda c: c.__name__)
def test_every_pileworks_error_is_caught_by_type(
    error: type[PileworksError],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flows.cli import janitor
    from flows.cli.main import main

    def fail(args: object) -> int:
        exc = error.__new__(error)  # DatasetConflictError's __init__ also wants existing_uri
        exc.args = ("the store at file:///x answered 503 after 4 attempts",)
        raise exc

    monkeypatch.setattr(janitor, "run", fail)
    assert main(["janitor", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "pileworks janitor: error: the store at file:///x answered 503 after 4 attempts\n"


def test_a_config_error_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import janitor
    from flows.cli.main import main

    def fail(args: object) -> int:
        raise ConfigError("corpus.yaml: dedup.near.treshold: unknown field (did you mean 'threshold'?)")

    monkeypatch.setattr(janitor, "run", fail)
    assert main(["janitor", "--output", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("pileworks janitor: error: corpus.yaml: dedup.near.treshold")


def test_an_unexpected_error_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug is not one of our failures: it must not be turned into a one-line message."""
    from flows.cli import janitor
    from flows.cli.main import main

    class CheckpointError(RuntimeError):  # same name as ours, different class: names no longer match
        pass

    def fail(args: object) -> int:
        raise CheckpointError("a bug")

    monkeypatch.setattr(janitor, "run", fail)
    with pytest.raises(CheckpointError, match="a bug"):
        main(["janitor", "--output", str(tmp_path)])


def test_ctrl_c_that_a_flow_turns_into_another_error_is_still_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prefect's task engine, interrupted at the wrong moment, can raise "Task run is not set" instead of
    KeyboardInterrupt: after a Ctrl-C the command still ends as interrupted (exit 130, one line)."""
    import logging
    import os
    import signal
    import time

    from flows.cli import janitor
    from flows.cli.main import EXIT_INTERRUPTED, main

    teardown = logging.getLogger("distributed.batched")
    quiet_while_interrupted: list[bool] = []

    def interrupted_run(args: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler interrupts this at once
        except KeyboardInterrupt:
            # a Dask cluster torn down now logs closed comms with tracebacks: silenced after the Ctrl-C
            quiet_while_interrupted.append(not teardown.isEnabledFor(logging.ERROR))
            raise PileworksError("Task run is not set") from None
        raise AssertionError("no interrupt arrived")

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(janitor, "run", interrupted_run)
    assert main(["janitor", "--output", str(tmp_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("pileworks janitor: interrupted")
    assert signal.getsignal(signal.SIGINT) is before  # the handler is the caller's again
    assert quiet_while_interrupted == [True] and teardown.isEnabledFor(logging.ERROR)  # and loud again after
    monkeypatch.setattr(janitor, "run", lambda args: 0)
    assert main(["janitor", "--output", str(tmp_path)]) == 0  # and the next command is not "interrupted"


@pytest.mark.parametrize("source", ["started local server", "local server"])
def test_the_command_that_starts_the_local_server_says_so_once_and_how_it_stops(
    monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    import contextlib
    import logging

    from flows.cli import build, main
    from flows.runtime.local_server import Api

    said: list[str] = []
    api = Api(url="http://127.0.0.1:4321/api", ui_url="http://127.0.0.1:4321", source=source)
    monkeypatch.setattr(main, "resolve_api", lambda **kw: api)
    monkeypatch.setattr(main, "using_api", contextlib.nullcontext)
    monkeypatch.setattr(build, "precheck", lambda args: None)
    monkeypatch.setattr(build, "run", lambda args: 0)
    monkeypatch.setattr(logging.getLogger("pileworks"), "info", lambda msg, *a: said.append(msg % a))
    monkeypatch.setenv("PILEWORKS_SERVER_IDLE_MINUTES", "45")
    assert main.main(["build", "--json"]) == 0
    notes = [s for s in said if "runs in the background" in s]
    if source == "local server":  # found running: said when it was started
        assert notes == []
        return
    assert len(notes) == 1 and "http://127.0.0.1:4321" in notes[0]
    assert "45 min without use" in notes[0] and "pileworks server stop" in notes[0]
    assert "pileworks server start" in notes[0]
