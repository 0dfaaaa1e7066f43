"""The core library never imports LangChain or LlamaIndex (only the adapter modules do)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = """
import importlib, pkgutil, sys
import retriever, retriever.integrations
index = sys.modules['retriever.index']
names = []
for pkg in (retriever, index):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not m.name.startswith("retriever.integrations.") and not m.name.endswith(".__main__"):
            names.append(m.name)
for name in names:
    importlib.import_module(name)
print(len(names))
print(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("langchain_core", "langchain", "llama_index", "pydantic")}))
"""


def test_core_imports_no_framework() -> None:
    res = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    count, frameworks = res.stdout.strip().splitlines()[-2:]
    assert int(count) > 20  # every module of the core library and the build side was imported
    assert frameworks == "[]"


def test_adapters_import_their_framework() -> None:
    code = ("import sys, retriever.integrations.langchain, retriever.integrations.llamaindex\n"
            "print('langchain_core' in sys.modules, 'llama_index.core' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "True"]
