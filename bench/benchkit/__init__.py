"""benchkit: the code of bench/run, one module per concept (bench/README.md lists them).

bench/run is the entry point; it puts bench/ on sys.path and calls benchkit.main.entry. The modules
use the standard library only.
"""
