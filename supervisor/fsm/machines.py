"""The engine: one ``transitions`` Machine per table, shared by every model.

A ``transitions`` machine keeps no per-model state of its own when it has no
queue: firing an event reads the model's ``state``, finds the transition the
table lists from it (``MachineError`` when there is none) and writes the new
state back. So one synchronous Machine per table, built here at import,
serves the replicas and apps of every AppFSM, and "building the machines" of
an app is creating its plain model records: no trigger methods are bound to
them (binding them cost about 0.1 ms per replica, paid in one block on the
event loop).

Only the app actor fires triggers, one at a time; nothing in a transition
does I/O, so the asyncio machine is not needed. The tables declare no
callbacks or conditions (models are plain records and every side effect is
decided outside the machine), so a transition here only writes the state:
``_Step`` skips the machinery of empty callback lists and debug logging, which
was three quarters of a trigger's cost (about 20 us of 25 on a loaded 2-core
machine), the machine looks a model's state up by its enum member, and an
event fires without the detour through the machine's (unused) queue.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Generic

from transitions import Event, Machine, Transition
from transitions.core import EventData, MachineError, State

from supervisor.fsm.tables import APP_TRANSITIONS, REPLICA_TRANSITIONS, S, TransitionRow
from supervisor.states import AppState, ReplicaState

__all__ = [
    "APP_ENGINE",
    "REPLICA_ENGINE",
    "AppModel",
    "Engine",
    "ReplicaModel",
    "StopReason",
]


class StopReason(enum.Enum):
    CANCEL = "cancel"  # the user cancelled the app
    GANG = "gang"  # a sibling failed for good; this one is stopped with it


class ReplicaModel:
    """What the app actor knows of one replica; ``state`` is written only by the engine."""

    __slots__ = (
        "attempt",
        "exit_code",
        "hostname",
        "msg",
        "replica_id",
        "restarts",
        "role",
        "signal",
        "state",
        "stop_reason",
        "structured_error_msg",
    )

    def __init__(self, role: str, replica_id: int) -> None:
        self.state = ReplicaState.UNSUBMITTED
        self.role = role
        self.replica_id = replica_id
        self.attempt = 0
        self.restarts = 0
        self.hostname = ""
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.msg = ""
        self.structured_error_msg = ""
        self.stop_reason: StopReason | None = None

    def __repr__(self) -> str:
        return f"<replica {self.role}/{self.replica_id} {self.state.name} attempt={self.attempt}>"


class AppModel:
    """The app's own state; written only by the engine."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = AppState.UNSUBMITTED


class _Step(Transition):
    """A transition with no callbacks and no conditions: it writes the destination state."""

    def execute(self, event_data: EventData) -> bool:
        machine = event_data.machine
        if self.dest is None:  # an internal transition; the tables list none
            raise MachineError(f"{event_data.event} has no destination")
        setattr(event_data.model, machine.model_attribute, machine.states[self.dest].value)
        return True


class _State(State):
    """A state whose name is read once: ``State.name`` asks the enum member every time."""

    def __init__(self, name: str | enum.Enum, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self._label = name.name if isinstance(name, enum.Enum) else name

    @property
    def name(self) -> str:
        return self._label


class _Event(Event):
    """Fires at once: the machine has no queue, so ``Machine._process`` would call it at once.

    The machine declares no ``prepare_event``, ``finalize_event`` or
    ``on_exception`` callbacks, so ``Event._trigger`` would only call empty
    callback lists and log two debug lines around the transition (a third of
    what a trigger cost): here the source is checked and the first transition
    listed from it executed, as ``Event._process`` does.
    """

    def trigger(self, model: object, *args: object, **kwargs: object) -> bool:
        data = EventData(None, self, self.machine, model, args=args, kwargs=kwargs)
        return self._fire(data)

    def _fire(self, data: EventData) -> bool:
        data.state = state = self.machine.get_model_state(data.model)
        if not self._is_valid_source(state):  # raises MachineError: invalid triggers count
            return False
        for transition in self.transitions[state.name]:
            data.transition = transition
            if transition.execute(data):
                data.result = True
                return True
        return False


class _Machine(Machine):
    event_cls = _Event
    state_cls = _State
    transition_cls = _Step

    def get_model_state(self, model: object) -> State:
        # By the enum member itself: ``Machine.get_state`` asks each member its name first.
        return self._by_member[getattr(model, self.model_attribute)]

    def index_states(self) -> None:
        self._by_member = {state.value: state for state in self.states.values()}


class Engine(Generic[S]):
    """Fires the triggers of one table on any model with a ``state`` attribute."""

    def __init__(self, states: type[S], table: Sequence[TransitionRow[S]]) -> None:
        self.machine = _Machine(
            model=None,
            states=states,
            transitions=[
                {"trigger": row.trigger, "source": list(row.source), "dest": row.dest}
                for row in table
            ],
            initial=states["UNSUBMITTED"],
            auto_transitions=False,
            send_event=False,
            queued=False,
        )
        self.machine.index_states()
        self._events = self.machine.events

    def fire(self, model: ReplicaModel | AppModel, trigger: str) -> None:
        """Take one transition; one the table does not list raises ``MachineError``."""
        if not self._events[trigger].trigger(model):
            raise MachineError(f"{trigger} did not change {model!r}")


REPLICA_ENGINE: Engine[ReplicaState] = Engine(ReplicaState, REPLICA_TRANSITIONS)
APP_ENGINE: Engine[AppState] = Engine(AppState, APP_TRANSITIONS)
