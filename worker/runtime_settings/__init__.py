"""MLX's own runtime settings, tuned per chip: the knobs MLX reads from its environment at start-up
that change no arithmetic (``knobs``), a model-shaped step measured in a fresh process per setting
(``step``), the paired search over them (``search``) and the file its results go in
(:mod:`kernelfleet.runtime_settings_file`). Importing the package imports no mlx: ``step`` runs in
the child processes."""
