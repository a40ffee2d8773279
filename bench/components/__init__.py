"""App definitions handed to the two command lines (``asupervisor run`` and ``torchx run``)."""
