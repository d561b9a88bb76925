"""pytest options: --device cpu|cuda|all picks where the op suites run (default: cpu, plus cuda
when xtrain sees a GPU); --live-report FILE appends each failed or errored test's report to FILE
as it happens (the GPU machine's calls are cut off at a time limit, before pytest's summary)."""


def pytest_addoption(parser):
    parser.addoption("--device", default="auto", help="cpu, cuda or auto (cpu plus cuda when present)")
    parser.addoption("--live-report", default=None, help="append each failure's report to this file at once")


_live_report = None  # --live-report's file, in the process that writes it


def pytest_runtest_logreport(report):
    """--live-report: the failure's node id, phase and traceback, written when it happens (under
    xdist the controller receives every worker's reports, so one process writes the file)."""
    path = _live_report
    if path and (report.failed or (report.when != "call" and report.outcome == "error")):
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} [{report.when}] ({report.duration:.1f} s)\n{report.longreprtext}\n")


def pytest_configure(config):
    global _live_report
    # under xdist only the controller writes (its workers' reports reach it too)
    _live_report = None if hasattr(config, "workerinput") else config.getoption("--live-report")


def _devices(config):
    import xtrain
    opt = config.getoption("--device")
    have_cuda = xtrain.cuda.is_available()
    if opt == "cpu":
        return ["cpu"]
    if opt == "cuda":
        return ["cuda"]
    return ["cpu", "cuda"] if have_cuda else ["cpu"]


def pytest_generate_tests(metafunc):
    already = any(m.name == "parametrize" and "device" in m.args[0] for m in metafunc.definition.iter_markers())
    if "device" in metafunc.fixturenames and not already:
        metafunc.parametrize("device", _devices(metafunc.config))
