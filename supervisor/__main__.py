"""``python -m supervisor``: the ``asupervisor`` command line."""

from supervisor.cli import main

if __name__ == "__main__":
    main()
