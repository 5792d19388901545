"""The hidden checks (never shipped to students). One module per task; see ``registry.py``
for how to add one (a module here with ``@define_check`` functions is discovered automatically)."""
