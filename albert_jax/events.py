"""TensorBoard event files, read back without TensorFlow.

`metrics.Writer` writes them: TFRecord framing (a length and a payload, each
followed by its masked CRC-32C) around serialised `tensorflow.Event`
protobufs whose scalars are `simple_value`s. This module holds that
checksum and the reader (`python -m albert_jax.report` draws its curves from
it); both CRCs of every record are checked.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import struct
from typing import Any, Iterator

EVENTS_GLOB = "events.out.tfevents.*"


class EventFileError(ValueError):
  """An event file that is corrupt or not an event file."""


def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_CRC_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C, rotated and offset."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: str) -> Iterator[bytes]:
  """The records of a TFRecord file, both CRCs checked.

  A last record cut short (a run killed while writing) ends the file, as in
  TensorBoard; a checksum that does not match is an error.
  """
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos + 12 <= len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
    if header_crc != masked_crc32c(header):
      raise EventFileError(f"{path}: corrupt record header at byte {pos}.")
    end = pos + 12 + length
    if end + 4 > len(data):
      return
    record = data[pos + 12:end]
    (crc,) = struct.unpack("<I", data[end:end + 4])
    if crc != masked_crc32c(record):
      raise EventFileError(f"{path}: corrupt record at byte {pos}.")
    yield record
    pos = end + 4


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    if pos >= len(buf):
      raise EventFileError("Truncated varint in an event protobuf.")
    byte = buf[pos]
    value |= (byte & 0x7F) << shift
    pos, shift = pos + 1, shift + 7
    if not byte & 0x80:
      return value, pos


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
  """(field number, wire type, value) of a serialised protobuf message."""
  pos = 0
  while pos < len(buf):
    key, pos = _read_varint(buf, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _read_varint(buf, pos)
    elif wire in (1, 5):
      size = 8 if wire == 1 else 4
      value, pos = buf[pos:pos + size], pos + size
    elif wire == 2:
      size, pos = _read_varint(buf, pos)
      value, pos = buf[pos:pos + size], pos + size
    else:
      raise EventFileError(f"Unsupported protobuf wire type {wire}.")
    if pos > len(buf):
      raise EventFileError("Truncated field in an event protobuf.")
    yield number, wire, value


@dataclasses.dataclass(frozen=True)
class Event:
  """One `tensorflow.Event`: its step, time and scalar summaries."""
  step: int
  wall_time: float
  scalars: dict[str, float]
  file_version: str = ""


def parse_event(data: bytes) -> Event:
  """Decodes a serialised Event; values other than simple_value are skipped."""
  step, wall_time, version, scalars = 0, 0.0, "", {}
  for number, _, value in _fields(data):
    if number == 1:
      (wall_time,) = struct.unpack("<d", value)
    elif number == 2:
      step = value - (1 << 64) if value >= 1 << 63 else value
    elif number == 3:
      version = value.decode()
    elif number == 5:  # Summary: repeated Value (tag = 1, simple_value = 2)
      for v_number, _, v in _fields(value):
        if v_number != 1:
          continue
        parts = {n: x for n, _, x in _fields(v)}
        if 1 in parts and 2 in parts:
          scalars[parts[1].decode()] = struct.unpack("<f", parts[2])[0]
  return Event(step, wall_time, scalars, version)


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """tag → [(step, value)] sorted by step, over every event file in `logdir`.

  Files are read oldest first (their names start with the creation time),
  so a step logged again after a resume takes its latest value.
  """
  def created(path):
    stamp = os.path.basename(path).split(".")[3]
    return (int(stamp) if stamp.isdigit() else 0, path)
  paths = sorted(glob.glob(os.path.join(logdir, EVENTS_GLOB)), key=created)
  series: dict[str, dict[int, float]] = {}
  for path in paths:
    for record in read_records(path):
      event = parse_event(record)
      for tag, value in event.scalars.items():
        series.setdefault(tag, {})[event.step] = value
  return {tag: sorted(points.items()) for tag, points in series.items()}
