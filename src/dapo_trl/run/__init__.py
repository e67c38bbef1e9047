"""What surrounds a run: data loading, evaluation, launch lines, the batch plan, the console, the run record,
plots, the toy task of the CPU demo and the shared command-line checks.
"""
