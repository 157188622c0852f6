"""Maps the top-level folders onto the `rillet` import package.

`rillet` itself is an implicit namespace package and `http/` has no `__init__.py` on purpose: a
regular package named `http` in the repo root would shadow the standard library's `http` for any
`python -c ...` started there (the working directory comes first on sys.path) and break aiohttp.
A namespace portion loses to the standard library's regular package, so that cannot happen.
"""

from setuptools import setup

setup(
    packages=[
        "rillet.core",
        "rillet.core.attention",
        "rillet.core.loaders",
        "rillet.core.model",
        "rillet.core.quant",
        "rillet.core.tokenizer",
        "rillet.http",
        "rillet.graphs",
    ],
    package_dir={"rillet": "."},
    # the browser page (http/ui.py): plain HTML, CSS and JS, served from the installed package
    package_data={"rillet.http": ["static/*"]},
)
