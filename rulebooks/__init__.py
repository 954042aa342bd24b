"""The built-in rulebooks (``*.egg``), shipped as the package data of ``eqgrad.rulebooks``
(pyproject.toml maps this folder there; eqgrad/rules/book.py reads it with importlib.resources).

A regular package, not a namespace one: setuptools' editable finder cannot import a nested namespace
package mapped with ``package-dir`` (pypa/setuptools#4943), and this file makes ``pip install -e .``
find the rulebooks the same way an installed wheel does."""
