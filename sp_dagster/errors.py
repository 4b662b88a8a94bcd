"""The errors a user can act on. The CLI prints them as one line, never as a traceback."""


class SpDagsterError(Exception):
    """Base class: the message says what went wrong and what to do next.

    >>> import sp_dagster
    >>> try:
    ...     sp_dagster.parse("define stream S (x int")
    ... except sp_dagster.SpDagsterError as error:   # line, column and one sentence, never a traceback
    ...     print(type(error).__name__, str(error).split(";")[0])
    SiddhiQLError 1:20: Unexpected end of text
    """

    exit_code = 1


class ConfigError(SpDagsterError):
    """A deployment.yaml (or a value in it) is missing, malformed or inconsistent."""


class MessagingError(SpDagsterError):
    """The messaging layer (Kafka, NATS) refused or could not be reached."""


class ProducerFenced(MessagingError):
    """A newer owner of an instance publishes now: this copy must stop."""


class BrokerUnavailable(MessagingError):
    """No broker answered at the configured address."""


class JetStreamUnavailable(MessagingError):
    """The NATS server answered but does not run JetStream."""


class TopicError(MessagingError):
    """A topic is missing, or cannot be created or grown as asked."""


class TopicCannotGrow(TopicError):
    """A topic has fewer partitions than asked and the broker cannot add them to it."""


class EventDecodeError(MessagingError):
    """An event on a topic could not be decoded into the stream's attributes."""


class ControlPlaneError(SpDagsterError):
    """The control-plane database refused a request, or holds something this version cannot use."""


class DatabaseUnavailable(ControlPlaneError):
    """The control-plane database could not be reached (or dropped the connection)."""


class PersistenceError(ControlPlaneError):
    """State revisions could not be saved or restored, or their table cannot be used."""


class NotOwnerError(PersistenceError):
    """A save refused: the saving node incarnation does not own the instance (any more)."""
