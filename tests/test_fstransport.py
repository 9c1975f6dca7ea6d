"""The run command's filesystem task broker (broker/fstransport.py): a consumer never takes a message that is
still being written, the cause of a worker stopping with a JSONDecodeError under bin/run's pool per queue."""

from __future__ import annotations

from kombu import Connection


def _connection(tmp_path) -> Connection:
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
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
