"""The protobuf wire format, scanned and written directly.

Readers use the scanner to say where a binary file breaks (instead of protobuf's bare
DecodeError) and to reach packed float payloads without the protobuf runtime; writers use the
key and length headers to frame bytes they assemble themselves, and serialize a large message
one top-level field at a time.
"""

from ..proto import is_repeated

_WIRE_VARINT, _WIRE_64BIT, _WIRE_LEN, _WIRE_START, _WIRE_END, _WIRE_32BIT = 0, 1, 2, 3, 4, 5


def _varint(value):
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf, pos):
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise EOFError("varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _len_header(field_number, length):
    return _varint(field_number << 3 | _WIRE_LEN) + _varint(length)


def _scan_fields(buf, start=0, end=None):
    """Yield (field_number, wire_type, payload_start, payload_end, field_start) of one
    message level; field_start is where the field's key begins."""
    pos = start
    end = len(buf) if end is None else end
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0 at byte %d" % field_start)
        if wire == _WIRE_VARINT:
            _, after = _read_varint(buf, pos)
        elif wire == _WIRE_64BIT:
            after = pos + 8
        elif wire == _WIRE_32BIT:
            after = pos + 4
        elif wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            after = pos + length
        else:
            raise ValueError("field %d at byte %d has wire type %d (groups are not used by this "
                             "schema)" % (number, field_start, wire))
        if after > end:
            raise EOFError("field %d at byte %d needs %d bytes but only %d remain"
                           % (number, field_start, after - pos, end - pos))
        yield number, wire, pos, after, field_start
        pos = after


def _wire_problem(buf):
    """Describe where a binary message breaks at its top level, or None if the framing is sound."""
    try:
        for _ in _scan_fields(buf):
            pass
    except EOFError as e:
        return "truncated: %s" % e
    except ValueError as e:
        return "corrupt: %s" % e
    return None


def _message_chunks(message):
    """Serialize ``message`` as a sequence of byte chunks, one top-level field at a time.

    The concatenation equals message.SerializeToString(); peak memory is one layer's (or one
    history blob's) bytes instead of the whole model's.
    """
    if _has_unknown(message):
        # Unknown fields (from a newer schema) keep their bytes only in a whole serialization.
        yield message.SerializeToString()
        return
    cls = type(message)
    for fd, value in message.ListFields():
        if is_repeated(fd) and fd.type == fd.TYPE_MESSAGE:
            for item in value:
                body = item.SerializeToString()
                yield _len_header(fd.number, len(body))
                yield body
        else:
            single = cls()
            target = getattr(single, fd.name)
            if is_repeated(fd):
                target.extend(value)
            elif fd.type == fd.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(single, fd.name, value)
            yield single.SerializeToString()


def _has_unknown(message):
    from google.protobuf import unknown_fields
    return len(unknown_fields.UnknownFieldSet(message)) > 0


def _unknown_numbers(message):
    from google.protobuf import unknown_fields
    return sorted({f.field_number for f in unknown_fields.UnknownFieldSet(message)})
