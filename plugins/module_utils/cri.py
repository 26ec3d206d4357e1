# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ask a running containerd what its CRI plugin really loaded.

``config.toml`` on disk says what *should* happen; only the daemon knows whether the CRI plugin
accepted it (containerd 1.x drops the whole plugin on some valid-looking configs). This asks the
CRI ``RuntimeService`` for ``Status(verbose=true)`` and ``Version`` - the same calls as
``crictl info`` / ``crictl version`` - and normalises the answer into a plain dict.

Plain Python, no Ansible. Transports, in order: gRPC with ``grpcio`` (optional dependency) and a
tiny hand-written protobuf codec for the handful of messages needed (field numbers from
k8s.io/cri-api ``pkg/apis/runtime/v1/api.proto``, package ``runtime.v1``), else the ``crictl``
binary. No generated code and no ``protobuf`` package.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat
import subprocess
import time

try:
    import grpc
    HAS_GRPC = True
    GRPC_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    grpc = None
    HAS_GRPC = False
    GRPC_IMPORT_ERROR = exc

DEFAULT_TIMEOUT = 5.0
CRI_SERVICE = '/runtime.v1.RuntimeService/'
INSTALL_HINT = ('install the Python package grpcio (for example `pip install grpcio`) where this '
                'runs, or put crictl (cri-tools) on PATH')


class CriError(Exception):
    """The CRI API could not be asked or did not answer.

    ``kind`` says why, for callers that react differently: ``missing`` (no socket at that path),
    ``unavailable`` (nothing listening), ``timeout``, ``initializing`` (CRI not ready yet, right
    after a start), ``unimplemented`` (containerd answers but its CRI plugin is not loaded),
    ``no-transport`` (neither grpcio nor crictl), ``protocol`` (an answer we cannot read) or
    ``error`` (anything else).
    """

    def __init__(self, message, socket=None, kind='error'):
        super().__init__(message)
        self.socket = socket
        self.kind = kind


# --- protobuf wire format: just enough for the messages above -------------------------------

class WireError(ValueError):
    """Bytes that are not a valid protobuf message of the expected shape."""


def _varint(value):
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError('truncated varint')
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise WireError('varint longer than 64 bits')


def encode_field(number, value):
    """Encode one field: bool/int as varint, str/bytes as length-delimited."""
    if isinstance(value, bool) or isinstance(value, int):
        return _varint(number << 3) + _varint(int(value))
    if not isinstance(value, bytes):
        value = value.encode('utf-8')
    return _varint((number << 3) | 2) + _varint(len(value)) + value


def decode_fields(data):
    """Split a message into ``[(field_number, wire_type, value), ...]``.

    Varints come back as int, length-delimited fields as bytes; fixed32/fixed64 are skipped over
    as raw bytes. Unknown fields are kept so newer CRI versions (extra fields) still decode.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise WireError('expected bytes, got %s' % type(data).__name__)
    fields = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError('field number 0')
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise WireError('truncated length-delimited field %d' % number)
            value, pos = bytes(data[pos:pos + size]), pos + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            if pos + size > len(data):
                raise WireError('truncated fixed-size field %d' % number)
            value, pos = bytes(data[pos:pos + size]), pos + size
        else:  # 3/4 are deprecated groups, 6/7 do not exist: never used by the CRI API
            raise WireError('unsupported wire type %d in field %d' % (wire_type, number))
        fields.append((number, wire_type, value))
    return fields


def _text(value, what):
    if not isinstance(value, bytes):
        raise WireError('%s: expected a string field' % what)
    try:
        return value.decode('utf-8')
    except UnicodeDecodeError as exc:
        raise WireError('%s: not UTF-8' % what) from exc


def _varint_field(value, what):
    if isinstance(value, bytes):
        raise WireError('%s: expected a varint field' % what)
    return value


def encode_status_request(verbose=True):
    """StatusRequest{bool verbose = 1}; proto3 omits default values."""
    return encode_field(1, True) if verbose else b''


def encode_version_request(version='v1'):
    """VersionRequest{string version = 1} (the client's CRI API version)."""
    return encode_field(1, version) if version else b''


def decode_version_response(data):
    """VersionResponse{version = 1; runtime_name = 2; runtime_version = 3; runtime_api_version = 4}."""
    names = {1: 'version', 2: 'runtime_name', 3: 'runtime_version', 4: 'runtime_api_version'}
    result = dict((name, '') for name in names.values())
    for number, dummy, value in decode_fields(data):
        if number in names:
            result[names[number]] = _text(value, names[number])
    return result


def _decode_condition(data):
    # RuntimeCondition{string type = 1; bool status = 2; string reason = 3; string message = 4}
    cond = {'type': '', 'status': False, 'reason': '', 'message': ''}
    for number, dummy, value in decode_fields(data):
        if number == 1:
            cond['type'] = _text(value, 'RuntimeCondition.type')
        elif number == 2:
            cond['status'] = bool(_varint_field(value, 'RuntimeCondition.status'))
        elif number == 3:
            cond['reason'] = _text(value, 'RuntimeCondition.reason')
        elif number == 4:
            cond['message'] = _text(value, 'RuntimeCondition.message')
    return cond


def decode_status_response(data):
    """StatusResponse{RuntimeStatus status = 1; map<string,string> info = 2;
    repeated RuntimeHandler runtime_handlers = 3; ...}.

    Returns ``{"conditions": [{type, status, reason, message}], "info": {...},
    "runtime_handlers": [names]}``. RuntimeStatus is {repeated RuntimeCondition conditions = 1};
    a map entry is {key = 1; value = 2}; RuntimeHandler is {string name = 1; ...} (CRI >= 1.30,
    containerd 2.x).
    """
    result = {'conditions': [], 'info': {}, 'runtime_handlers': []}
    for number, dummy, value in decode_fields(data):
        if number == 1:
            for sub, dummy2, cond in decode_fields(_bytes(value, 'StatusResponse.status')):
                if sub == 1:
                    result['conditions'].append(_decode_condition(_bytes(cond, 'RuntimeStatus.conditions')))
        elif number == 2:
            key = val = ''
            for sub, dummy2, item in decode_fields(_bytes(value, 'StatusResponse.info')):
                if sub == 1:
                    key = _text(item, 'info key')
                elif sub == 2:
                    val = _text(item, 'info value')
            result['info'][key] = val
        elif number == 3:
            for sub, dummy2, item in decode_fields(_bytes(value, 'StatusResponse.runtime_handlers')):
                if sub == 1:
                    result['runtime_handlers'].append(_text(item, 'RuntimeHandler.name'))
    return result


def _bytes(value, what):
    if not isinstance(value, bytes):
        raise WireError('%s: expected an embedded message' % what)
    return value


# --- normalisation --------------------------------------------------------------------------

def _cri_config(raw):
    """The CRI config as a dict, whether it came as a JSON string (gRPC) or parsed (crictl)."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise CriError('CRI status info["config"] is not JSON: %s' % exc, kind='protocol') from exc
    if not isinstance(parsed, dict):
        raise CriError('CRI status info["config"] is not a JSON object', kind='protocol')
    return parsed


def _dict(value):
    return value if isinstance(value, dict) else {}


def normalise(transport, version, conditions, config, runtime_handlers=None):
    """Build the result dict from the pieces both transports produce.

    The CRI config JSON has the same relevant keys in containerd 1.6, 1.7 and 2.x:
    ``containerd.defaultRuntimeName`` and ``containerd.runtimes.<name>.{runtimeType, options}``;
    ``enableCDI``/``cdiSpecDirs`` from 1.7 on. 2.x reports only its runtime plugin here (no image
    settings such as ``sandboxImage``) and fills in every runc option, 1.x only those written.
    """
    ctd = _dict(config.get('containerd'))
    runtimes = {}
    for name, spec in sorted(_dict(ctd.get('runtimes')).items()):
        spec = _dict(spec)
        runtimes[name] = {
            'runtime_type': spec.get('runtimeType', ''),
            'runtime_path': spec.get('runtimePath', ''),
            # 1.x reports absent options as null; keep "no options" a dict for callers
            'options': _dict(spec.get('options')),
        }
    conds = {}
    for cond in conditions:
        conds[cond.get('type', '')] = {
            'status': bool(cond.get('status')),
            'reason': cond.get('reason') or '',
            'message': cond.get('message') or '',
        }
    return {
        'transport': transport,
        'runtime_name': version.get('runtime_name', ''),
        'runtime_version': version.get('runtime_version', ''),
        'runtime_api_version': version.get('runtime_api_version', ''),
        'conditions': conds,
        'runtime_ready': bool(conds.get('RuntimeReady', {}).get('status')),
        'default_runtime_name': ctd.get('defaultRuntimeName', ''),
        'runtimes': runtimes,
        'runtime_handlers': list(runtime_handlers or []),
        # None: this containerd does not report it (1.6 has no CDI setting)
        'enable_cdi': config.get('enableCDI'),
        'cdi_spec_dirs': list(config.get('cdiSpecDirs') or []),
        'raw_config': config,
    }


# --- transport 1: gRPC ----------------------------------------------------------------------

def _socket_path(socket):
    if socket.startswith('unix://'):
        socket = socket[len('unix://'):]
    return os.path.abspath(socket)


def _check_socket(path):
    # grpc would only say "failed to connect"; name the real problem first
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise CriError('containerd socket %s does not exist or is not reachable (%s)' % (path, exc.strerror),
                       socket=path, kind='missing') from exc
    if not stat.S_ISSOCK(mode):
        raise CriError('%s is not a unix socket' % path, socket=path)


def _grpc_error(exc, path, timeout):
    code = exc.code() if hasattr(exc, 'code') else None
    details = exc.details() if hasattr(exc, 'details') else str(exc)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CriError('containerd at %s does not serve the CRI API runtime.v1 (%s): the CRI plugin '
                        'is not loaded - see `ctr --address %s plugins ls` and the daemon log'
                        % (path, details, path), socket=path, kind='unimplemented')
    if 'not initialized' in (details or ''):
        return CriError('CRI at %s is still starting: %s' % (path, details), socket=path, kind='initializing')
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CriError('no CRI answer from %s within %ss' % (path, timeout), socket=path, kind='timeout')
    if code == grpc.StatusCode.UNAVAILABLE:
        return CriError('cannot connect to %s: %s' % (path, details), socket=path, kind='unavailable')
    return CriError('CRI call to %s failed: %s %s' % (path, code, details), socket=path)


def _grpc_status(path, timeout):
    channel = grpc.insecure_channel('unix://' + path)
    try:
        def call(method, request):
            # raw bytes in and out: the codec above does the (de)serialising
            stub = channel.unary_unary(CRI_SERVICE + method, request_serializer=None,
                                       response_deserializer=None)
            return stub(request, timeout=timeout)
        try:
            version = decode_version_response(call('Version', encode_version_request()))
            status = decode_status_response(call('Status', encode_status_request(True)))
        except grpc.RpcError as exc:
            raise _grpc_error(exc, path, timeout) from exc
        except WireError as exc:
            raise CriError('unreadable CRI answer from %s: %s' % (path, exc), socket=path, kind='protocol') from exc
    finally:
        channel.close()
    return normalise('grpc', version, status['conditions'], _cri_config(status['info'].get('config')),
                     status['runtime_handlers'])


# --- transport 2: crictl --------------------------------------------------------------------

def parse_crictl_version(text):
    """``crictl version`` prints ``Key:  value`` lines (newer ones can print JSON with -o json)."""
    text = text.strip()
    if text.startswith('{'):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError('crictl version JSON is not an object')
        return {'version': data.get('version', ''), 'runtime_name': data.get('runtimeName', ''),
                'runtime_version': data.get('runtimeVersion', ''),
                'runtime_api_version': data.get('runtimeApiVersion', '')}
    keys = {'Version': 'version', 'RuntimeName': 'runtime_name', 'RuntimeVersion': 'runtime_version',
            'RuntimeApiVersion': 'runtime_api_version'}
    result = dict((name, '') for name in keys.values())
    for line in text.splitlines():
        key, sep, value = line.partition(':')
        if sep and key.strip() in keys:
            result[keys[key.strip()]] = value.strip()
    if not result['runtime_name']:
        raise ValueError('no RuntimeName in crictl version output: %r' % text[:200])
    return result


def parse_crictl_info(text):
    """``crictl info -o json``: {"status": {"conditions": [...]}, "config": {...}, ...}.

    crictl re-parses each Status info value that is JSON, so ``config`` is normally an object;
    accept a JSON string as well. Returns ``(conditions, config, runtime_handlers)``.
    """
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError('crictl info output is not a JSON object')
    status = data.get('status') or {}
    conditions = status.get('conditions', []) if isinstance(status, dict) else None
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        raise ValueError('crictl info status.conditions is not a list of objects')
    handlers = data.get('runtimeHandlers') or []
    if not isinstance(handlers, list):
        raise ValueError('crictl info runtimeHandlers is not a list')
    names = [h.get('name', '') for h in handlers if isinstance(h, dict)]
    return conditions, _cri_config(data.get('config')), names


def _run_crictl(crictl, path, args, timeout):
    cmd = [crictl, '--runtime-endpoint', 'unix://' + path, '--timeout', '%ds' % max(1, int(timeout))] + args
    try:
        # Plain Python on purpose (the lab and tests use this client without an AnsibleModule).
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=subprocess-run-check,ansible-bad-function
                              universal_newlines=True, timeout=timeout + 5)
    except subprocess.TimeoutExpired as exc:
        raise CriError('crictl got no CRI answer from %s within %ss' % (path, timeout), socket=path,
                       kind='timeout') from exc
    if proc.returncode != 0:
        err = proc.stderr.strip()
        kind = 'error'
        if 'Unimplemented' in err or 'unknown service' in err:
            kind = 'unimplemented'
        elif 'not initialized' in err:
            kind = 'initializing'
        elif 'DeadlineExceeded' in err:
            kind = 'timeout'
        elif 'Unavailable' in err:
            kind = 'unavailable'
        raise CriError('`%s` failed for %s (rc %d): %s' % (' '.join(cmd), path, proc.returncode, err),
                       socket=path, kind=kind)
    return proc.stdout


def _crictl_status(crictl, path, timeout):
    try:
        version = parse_crictl_version(_run_crictl(crictl, path, ['version'], timeout))
        conditions, config, handlers = parse_crictl_info(_run_crictl(crictl, path, ['info', '-o', 'json'], timeout))
    except ValueError as exc:
        raise CriError('unreadable crictl output for %s: %s' % (path, exc), socket=path, kind='protocol') from exc
    return normalise('crictl', version, conditions, config, handlers)


def _which(name):
    if os.path.sep in name:
        return name if os.access(name, os.X_OK) else None
    for folder in os.environ.get('PATH', os.defpath).split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


# --- entry point ----------------------------------------------------------------------------

# worth asking again: the daemon is (re)starting rather than broken
RETRY_KINDS = ('missing', 'unavailable', 'initializing')


def cri_status(socket, timeout=DEFAULT_TIMEOUT, transport='auto', crictl='crictl', retry_for=0.0):
    """What the containerd listening on ``socket`` has loaded, as a plain dict.

    ``transport``: ``auto`` (gRPC when grpcio imports, else crictl), ``grpc`` or ``crictl``.
    ``retry_for``: seconds to keep asking while the socket is missing, refuses or CRI is still
    initialising (after a restart). Raises CriError (with ``.socket`` and ``.kind``).
    """
    deadline = time.monotonic() + retry_for
    while True:
        try:
            return _cri_status_once(socket, timeout, transport, crictl)
        except CriError as exc:
            if exc.kind not in RETRY_KINDS or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)


def _cri_status_once(socket, timeout, transport, crictl):
    path = _socket_path(socket)
    if transport not in ('auto', 'grpc', 'crictl'):
        raise ValueError('transport must be auto, grpc or crictl, not %r' % (transport,))
    crictl_path = _which(crictl) if transport != 'grpc' else None
    if transport == 'grpc' or (transport == 'auto' and HAS_GRPC):
        if not HAS_GRPC:
            raise CriError('cannot ask %s: grpcio is not importable (%s); %s'
                           % (path, GRPC_IMPORT_ERROR, INSTALL_HINT), socket=path, kind='no-transport')
        _check_socket(path)
        return _grpc_status(path, timeout)
    if crictl_path:
        _check_socket(path)
        return _crictl_status(crictl_path, path, timeout)
    if transport == 'crictl':
        raise CriError('cannot ask %s: %s not found on PATH; %s' % (path, crictl, INSTALL_HINT),
                       socket=path, kind='no-transport')
    raise CriError('cannot ask %s: neither is grpcio importable (%s) nor is %s on PATH; %s'
                   % (path, GRPC_IMPORT_ERROR, crictl, INSTALL_HINT), socket=path, kind='no-transport')
