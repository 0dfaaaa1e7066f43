"""Run pytest with ``retriever._kernels`` replaced by the extension at $RETRIEVER_KERNELS_SO
(the sanitizer build made by ``make -C cpp_ext sanitize``). Test tooling only."""

import importlib.util
import os
import sys

import pytest

so = os.environ["RETRIEVER_KERNELS_SO"]
spec = importlib.util.spec_from_file_location("retriever._kernels", so)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["retriever._kernels"] = mod
import retriever  # noqa: E402

retriever._kernels = mod
assert retriever._kernels.__file__ == os.path.abspath(so) or retriever._kernels.__file__ == so, retriever._kernels.__file__
print(f"sanitized kernels: {mod.__file__}")
sys.exit(pytest.main(sys.argv[1:]))
