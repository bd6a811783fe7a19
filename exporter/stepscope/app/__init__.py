"""The application: the ``stepscope`` command, its configuration and the wiring of
``stepscope serve`` (which sources run, the sampler, the web server).

Only this package imports every other one; nothing imports it but ``python -m stepscope``.
"""
