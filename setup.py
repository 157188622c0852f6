"""Maps the top-level folders onto the `rillet` import package.

`rillet` itself is an implicit namespace package and `http/` has no `__init__.py` on purpose: a
regular package named `http` in the repo root would shadow the standard library's `http` for any
`python -c ...` started there (the working directory comes first on sys.path) and break aiohttp.
A namespace portion loses to the standard library's regular package, so that cannot happen.

Packages are found, not listed: every folder under core/, http/ and graphs/ ships (a folder of
data, like the browser page's static/, is a package whose files are package data), so a new
subpackage can never be left out of a built wheel (tests/core/test_packaging.py installs one).
"""

from setuptools import find_namespace_packages, setup

TOP_LEVEL = ("core", "http", "graphs")


def rillet_packages() -> list[str]:
    found = find_namespace_packages(
        where=".",
        include=[*TOP_LEVEL, *(f"{top}.*" for top in TOP_LEVEL)],
        exclude=["*__pycache__*"],
    )
    return [f"rillet.{name}" for name in found]


setup(
    packages=rillet_packages(),
    package_dir={"rillet": "."},
    # the browser page (http/ui/): plain HTML, CSS and JS, served from the installed package
    package_data={
        "rillet.http.ui.static": ["*"],
        "rillet.core.quant": ["kernels/*.cpp"],
        "rillet.core.attention": ["kernels/*.cpp"],
    },
)
