# Builds the package and its C kernels. The kernels in csrc/ are compiled by cffi in
# out-of-line API mode (csrc/build_ffi.py), so `pip install .` needs only a C compiler.
from setuptools import find_packages, setup

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
    install_requires=["numpy>=1.22", "cffi>=1.15"],
    setup_requires=["cffi>=1.15"],
    cffi_modules=["csrc/build_ffi.py:ffi"],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "train": ["torch==2.13.0"],
        "reference": ["torch==2.13.0", "transformers", "tokenizers"],
    },
    entry_points={"console_scripts": ["tinydiff = tinydiff.cli:main"]},
    zip_safe=False,
)
