# Builds the package and its C kernels. The kernels in csrc/ are compiled by cffi in
# out-of-line API mode (csrc/build_ffi.py), so `pip install .` needs only a C compiler.
import atexit
import shutil
import tempfile

from setuptools import find_packages, setup

# Every build starts from an empty directory outside the tree, removed when setup.py exits: an
# in-tree build/lib outlives the sources, so a module deleted from tinydiff/ would still be packed
# into the next wheel, and `pip install .` would leave build/ and tinydiff.egg-info behind. The cost
# is a full compile of csrc/ every time (~10 s).
BUILD = tempfile.mkdtemp(prefix="tinydiff-build-")
atexit.register(shutil.rmtree, BUILD, ignore_errors=True)

setup(
    name="tinydiff",
    version="0.1.0",
    description="A from-scratch CPU inference engine for autoregressive and masked-diffusion language models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    # weights/ ships inside the package as tinydiff/models, so the default models are found after
    # `pip install .` from anywhere, not only inside the repository
    packages=find_packages(include=["tinydiff", "tinydiff.*"]) + ["tinydiff.models"],
    package_dir={"tinydiff.models": "weights"},
    package_data={"tinydiff.models": ["*/*.json", "*/*.safetensors", "*/*.md", "*/*.svg"]},
    # jinja2 renders chat templates (formats/chat_template.py); 3.1.6 closes known sandbox escapes
    install_requires=["numpy>=1.22", "cffi>=1.15", "jinja2>=3.1.6"],
    setup_requires=["cffi>=1.15"],
    cffi_modules=["csrc/build_ffi.py:ffi"],
    extras_require={
        "serve": ["starlette>=0.40", "uvicorn>=0.30"],
        "test": ["pytest", "hypothesis", "starlette>=0.40", "uvicorn>=0.30", "httpx", "openai", "gguf"],
        "train": ["torch==2.13.0"],
        "reference": ["torch==2.13.0", "transformers", "tokenizers"],
    },
    entry_points={"console_scripts": ["tinydiff = tinydiff.cli:main"]},
    zip_safe=False,
    options={"build": {"build_base": BUILD}, "egg_info": {"egg_base": BUILD}},
)
