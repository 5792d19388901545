"""One builder module per course notebook (``nb<N>_<name>.py``, each with a ``build()``), plus
``cells.py``: the cell kinds and the cells every notebook shares. Split per notebook so that a
change to one notebook touches one small file."""
