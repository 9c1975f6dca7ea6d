"""The run command's filesystem task broker (broker/fstransport.py): a consumer never takes a message that is
still being written, the cause of a worker stopping with a JSONDecodeError under bin/run's pool per queue."""

from __future__ import annotations

from kombu import Connection


def _connection(tmp_path) -> Connection:
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(tmp_path / "control"),  # else "control" in the working directory
        "store_processed": False,
    }
    return Connection("filesystem://", transport="broker.fstransport:Transport", transport_options=options)


def test_a_message_being_written_is_not_taken_and_a_whole_one_is(tmp_path):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("provisioning")
        # A message another process is still writing: under its partial name, empty so far.
        (tmp_path / "queue" / "1_writing.provisioning.msg.part").write_bytes(b"")
        queue.put({"order": 7})
        whole = [p.name for p in (tmp_path / "queue").iterdir() if not p.name.endswith(".part")]
        assert len(whole) == 1 and whole[0].endswith(".provisioning.msg")  # renamed into place, complete
        message = queue.get(timeout=5)
        assert message.payload == {"order": 7}
        message.ack()
        # What is left is the partial file: no consumer read it as an empty message.
        assert [p.name for p in (tmp_path / "queue").iterdir()] == ["1_writing.provisioning.msg.part"]
        queue.close()


def test_an_exchange_table_another_worker_has_just_created_is_an_empty_table(tmp_path):
    """Workers starting together bind their queues to one exchange table file: one created it and had not yet
    written it when another read it, and that worker stopped at start-up with a JSONDecodeError."""
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        control = channel.control_folder
        control.mkdir(exist_ok=True)
        (control / "tasks.exchange").write_bytes(b"")  # created by another worker, not yet written

        assert channel.get_table("tasks") == []
        channel._queue_bind("tasks", "provisioning", "", "provisioning")
        channel._queue_bind("tasks", "sync", "", "sync")
        channel._queue_bind("tasks", "sync", "", "sync")  # binding twice keeps one

        assert [q.queue for q in channel.get_table("tasks")] == ["sync", "provisioning"]
