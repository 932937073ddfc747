from setuptools import find_packages, setup

setup(
    name="horovodlike",
    version="0.1.0",
    description="Horovod's API on a framework-free C engine",
    packages=find_packages(include=["horovodlike", "horovodlike.*", "timeline_viewer",
                                    "timeline_viewer.*"]),
    python_requires=">=3.9",
    install_requires=["cffi>=1.15", "numpy"],
    setup_requires=["cffi>=1.15"],
    cffi_modules=["horovodlike/_build_engine.py:ffibuilder"],
    entry_points={"console_scripts": [
        "horovodlikerun = horovodlike.runner.launch:main",
        "horovodlike-timeline = timeline_viewer.__main__:main",
    ]},
)
