import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With `DAPO_TRL_FAIL_ON_SKIP=1` (`make test-vllm`, CI's vllm tier) a skipped test fails, with its skip reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("DAPO_TRL_FAIL_ON_SKIP") == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped while DAPO_TRL_FAIL_ON_SKIP=1 (every test of this tier must run): {reason}"


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: pass --run-slow")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--run-slow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2_dir(request) -> Path:
    """SmolLM2-135M-Instruct as a converted folder (tests marked `real_model`); skips with the reason when absent."""
    from _real_model import smollm2_folder

    return smollm2_folder(Path(request.config.cache.mkdir("smollm2-135m-instruct")))
