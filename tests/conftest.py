"""pytest options: --device cpu|cuda|all picks where the op suites run (default: cpu, plus cuda
when xtrain sees a GPU)."""


def pytest_addoption(parser):
    parser.addoption("--device", default="auto", help="cpu, cuda or auto (cpu plus cuda when present)")


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
