# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CRI client's protobuf wire codec, crictl output parsing and normalisation (no daemon)."""

from __future__ import absolute_import, division, print_function

import json
import os
import socket
import stat
import textwrap

import pytest

import require
from ansible_collections.gpuready.nvidia.plugins.module_utils import cri

# What containerd 1.7.24 returned in info["config"] (trimmed to the keys the client reads + some)
CONFIG_17 = {
    'containerd': {
        'snapshotter': 'overlayfs', 'defaultRuntimeName': 'nvidia',
        'defaultRuntime': {'runtimeType': '', 'options': None},
        'runtimes': {
            'nvidia': {'runtimeType': 'io.containerd.runc.v2', 'runtimePath': '', 'PodAnnotations': None,
                       'options': {'BinaryName': '/usr/bin/nvidia-container-runtime', 'SystemdCgroup': True},
                       'privileged_without_host_devices': False, 'sandboxMode': 'podsandbox'},
            'runc': {'runtimeType': 'io.containerd.runc.v2', 'runtimePath': '', 'options': None},
        },
    },
    'enableCDI': False, 'cdiSpecDirs': ['/etc/cdi', '/var/run/cdi'], 'containerdRootDir': '/var/lib/containerd',
}


def _len(field, payload):
    """A length-delimited field, written out by hand (independent of the encoder under test)."""
    assert len(payload) < 128 and field < 16
    return bytes([field << 3 | 2, len(payload)]) + payload


def _condition(ctype, status, reason=b'', message=b''):
    body = _len(1, ctype) + (b'\x10\x01' if status else b'')
    if reason:
        body += _len(3, reason)
    if message:
        body += _len(4, message)
    return body


# --- encoder ----------------------------------------------------------------------------------

@pytest.mark.parametrize('value,encoded', [
    (0, b'\x00'), (1, b'\x01'), (127, b'\x7f'), (128, b'\x80\x01'), (300, b'\xac\x02'),
    (2 ** 32, b'\x80\x80\x80\x80\x10'), (2 ** 64 - 1, b'\xff' * 9 + b'\x01'),
])
def test_varint_round_trip(value, encoded):
    assert cri._varint(value) == encoded  # pylint: disable=protected-access
    assert cri._read_varint(encoded, 0) == (value, len(encoded))  # pylint: disable=protected-access


def test_requests():
    assert cri.encode_status_request(True) == b'\x08\x01'
    assert cri.encode_status_request(False) == b''  # proto3: false is not sent
    assert cri.encode_version_request('v1') == b'\x0a\x02v1'
    assert cri.encode_version_request('') == b''
    assert cri.encode_field(2, 'é') == b'\x12\x02\xc3\xa9'
    assert cri.encode_field(1, b'\x00\xff') == b'\x0a\x02\x00\xff'


# --- decoder ----------------------------------------------------------------------------------

def test_version_response():
    data = _len(1, b'0.1.0') + _len(2, b'containerd') + _len(3, b'1.6.20~ds1') + _len(4, b'v1')
    assert cri.decode_version_response(data) == {
        'version': '0.1.0', 'runtime_name': 'containerd', 'runtime_version': '1.6.20~ds1',
        'runtime_api_version': 'v1'}


def test_version_response_empty_and_unknown_fields():
    # proto3 leaves out empty strings; field 9 (varint) and 10 (fixed64) come from a newer peer
    data = _len(2, b'containerd') + b'\x48\x05' + b'\x51' + b'\x00' * 8
    assert cri.decode_version_response(data) == {
        'version': '', 'runtime_name': 'containerd', 'runtime_version': '', 'runtime_api_version': ''}


def test_status_response():
    status = _len(1, _condition(b'RuntimeReady', True)) + _len(1, _condition(
        b'NetworkReady', False, b'NetworkPluginNotReady', b'cni plugin not initialized'))
    info = _len(2, _len(1, b'golang') + _len(2, b'"go1.19.8"')) + _len(2, _len(1, b'config') + _len(2, b'{}'))
    handlers = _len(3, _len(1, b'nvidia') + _len(2, b'\x08\x01')) + _len(3, _len(1, b'runc'))
    features = _len(4, b'\x08\x01')
    result = cri.decode_status_response(_len(1, status) + info + handlers + features)
    assert result == {
        'conditions': [
            {'type': 'RuntimeReady', 'status': True, 'reason': '', 'message': ''},
            {'type': 'NetworkReady', 'status': False, 'reason': 'NetworkPluginNotReady',
             'message': 'cni plugin not initialized'},
        ],
        'info': {'golang': '"go1.19.8"', 'config': '{}'},
        'runtime_handlers': ['nvidia', 'runc'],
    }


def test_status_response_map_entry_without_value():
    assert cri.decode_status_response(_len(2, _len(1, b'key')))['info'] == {'key': ''}


def test_status_response_large_info_value():
    config = json.dumps(CONFIG_17).encode() * 3  # > 127 bytes: multi-byte length prefix
    entry = cri.encode_field(1, 'config') + cri.encode_field(2, config)
    result = cri.decode_status_response(cri.encode_field(2, entry))
    assert result['info']['config'].encode() == config


def test_empty_status_response():
    assert cri.decode_status_response(b'') == {'conditions': [], 'info': {}, 'runtime_handlers': []}


@pytest.mark.parametrize('data,message', [
    (b'\x08', 'truncated varint'),
    (b'\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01', 'longer than 64 bits'),
    (b'\x0a\x05abc', 'truncated length-delimited field 1'),
    (b'\x0a\x80', 'truncated varint'),
    (b'\x0b\x00', 'unsupported wire type 3'),
    (b'\x0e', 'unsupported wire type 6'),
    (b'\x02\x00', 'field number 0'),
    (b'\x09\x00\x00', 'truncated fixed-size field 1'),
    (b'\x0d\x00', 'truncated fixed-size field 1'),
])
def test_malformed_bytes(data, message):
    with pytest.raises(cri.WireError, match=message):
        cri.decode_fields(data)


@pytest.mark.parametrize('data,message', [
    (b'\x08\x01', 'StatusResponse.status: expected an embedded message'),
    (b'\x10\x01', 'StatusResponse.info: expected an embedded message'),
    (_len(1, _len(1, _len(1, b'\xff\xfe'))), 'RuntimeCondition.type: not UTF-8'),
    (_len(1, _len(1, _len(2, b'x'))), 'RuntimeCondition.status: expected a varint'),
    (_len(1, b'\x08\x01'), 'RuntimeStatus.conditions: expected an embedded message'),
    (_len(1, _len(1, b'\x08\x01')), 'RuntimeCondition.type: expected a string'),
    (_len(2, b'\x08\x01'), 'info key: expected a string'),
    (_len(1, b'\x0a\x05ab'), 'truncated'),
])
def test_malformed_status_response(data, message):
    with pytest.raises(cri.WireError, match=message):
        cri.decode_status_response(data)


def test_decode_rejects_text():
    with pytest.raises(cri.WireError, match='expected bytes'):
        cri.decode_fields(u'\x08\x01')


def test_version_response_string_as_varint():
    with pytest.raises(cri.WireError, match='runtime_name: expected a string'):
        cri.decode_version_response(b'\x10\x01')


# --- cross-check against the protobuf runtime (when installed) ---------------------------------

def _proto_classes():
    """StatusResponse & co. built at runtime from descriptors (same field numbers as api.proto)."""
    descriptor_pb2 = require.module('google.protobuf.descriptor_pb2')
    from google.protobuf import descriptor_pool, message_factory  # pylint: disable=import-outside-toplevel

    fdp = descriptor_pb2.FileDescriptorProto(name='gpuready_cri_test.proto', package='runtime.v1', syntax='proto3')
    f = descriptor_pb2.FieldDescriptorProto
    string, boolean, message = f.TYPE_STRING, f.TYPE_BOOL, f.TYPE_MESSAGE
    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED

    def add(name, fields):
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            msg.field.add(name=fname, number=number, type=ftype, label=label, type_name=type_name)
        return msg

    add('StatusRequest', [('verbose', 1, boolean, optional, None)])
    add('VersionRequest', [('version', 1, string, optional, None)])
    add('VersionResponse', [('version', 1, string, optional, None), ('runtime_name', 2, string, optional, None),
                            ('runtime_version', 3, string, optional, None),
                            ('runtime_api_version', 4, string, optional, None)])
    add('RuntimeCondition', [('type', 1, string, optional, None), ('status', 2, boolean, optional, None),
                             ('reason', 3, string, optional, None), ('message', 4, string, optional, None)])
    add('RuntimeStatus', [('conditions', 1, message, repeated, '.runtime.v1.RuntimeCondition')])
    add('RuntimeHandler', [('name', 1, string, optional, None)])
    resp = add('StatusResponse', [('status', 1, message, optional, '.runtime.v1.RuntimeStatus'),
                                  ('info', 2, message, repeated, '.runtime.v1.StatusResponse.InfoEntry'),
                                  ('runtime_handlers', 3, message, repeated, '.runtime.v1.RuntimeHandler')])
    entry = resp.nested_type.add(name='InfoEntry')
    entry.options.map_entry = True
    entry.field.add(name='key', number=1, type=string, label=optional)
    entry.field.add(name='value', number=2, type=string, label=optional)

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return dict((name, message_factory.GetMessageClass(pool.FindMessageTypeByName('runtime.v1.' + name)))
                for name in ('StatusRequest', 'VersionRequest', 'VersionResponse', 'StatusResponse'))


def test_cross_check_with_protobuf():
    classes = _proto_classes()
    assert classes['StatusRequest'].FromString(cri.encode_status_request(True)).verbose is True
    assert classes['VersionRequest'].FromString(cri.encode_version_request('v1')).version == 'v1'

    version = classes['VersionResponse'](version='0.1.0', runtime_name='containerd',
                                         runtime_version='2.1.9+unknown', runtime_api_version='v1')
    assert cri.decode_version_response(version.SerializeToString()) == {
        'version': '0.1.0', 'runtime_name': 'containerd', 'runtime_version': '2.1.9+unknown',
        'runtime_api_version': 'v1'}

    status = classes['StatusResponse']()
    status.status.conditions.add(type='RuntimeReady', status=True)
    status.status.conditions.add(type='NetworkReady', status=False, reason='NetworkPluginNotReady', message='ü')
    status.info['config'] = json.dumps(CONFIG_17)
    status.info['golang'] = '"go1.24.4"'
    status.runtime_handlers.add(name='nvidia')
    decoded = cri.decode_status_response(status.SerializeToString())
    assert decoded['conditions'] == [
        {'type': 'RuntimeReady', 'status': True, 'reason': '', 'message': ''},
        {'type': 'NetworkReady', 'status': False, 'reason': 'NetworkPluginNotReady', 'message': 'ü'}]
    assert decoded['info'] == {'config': json.dumps(CONFIG_17), 'golang': '"go1.24.4"'}
    assert decoded['runtime_handlers'] == ['nvidia']


# --- normalisation ----------------------------------------------------------------------------

VERSION = {'version': '0.1.0', 'runtime_name': 'containerd', 'runtime_version': '1.7.24~ds1',
           'runtime_api_version': 'v1'}
CONDITIONS = [{'type': 'RuntimeReady', 'status': True, 'reason': '', 'message': ''},
              {'type': 'NetworkReady', 'status': False, 'reason': 'NetworkPluginNotReady', 'message': 'no cni'}]


def test_normalise():
    result = cri.normalise('grpc', VERSION, CONDITIONS, CONFIG_17, ['nvidia'])
    assert result == {
        'transport': 'grpc', 'runtime_name': 'containerd', 'runtime_version': '1.7.24~ds1',
        'runtime_api_version': 'v1',
        'conditions': {'RuntimeReady': {'status': True, 'reason': '', 'message': ''},
                       'NetworkReady': {'status': False, 'reason': 'NetworkPluginNotReady', 'message': 'no cni'}},
        'runtime_ready': True, 'default_runtime_name': 'nvidia',
        'runtimes': {
            'nvidia': {'runtime_type': 'io.containerd.runc.v2', 'runtime_path': '',
                       'options': {'BinaryName': '/usr/bin/nvidia-container-runtime', 'SystemdCgroup': True}},
            'runc': {'runtime_type': 'io.containerd.runc.v2', 'runtime_path': '', 'options': {}},
        },
        'runtime_handlers': ['nvidia'], 'enable_cdi': False, 'cdi_spec_dirs': ['/etc/cdi', '/var/run/cdi'],
        'raw_config': CONFIG_17,
    }


def test_normalise_sparse():
    """An empty config (CRI that reports nothing) and no conditions: not ready, nothing made up."""
    result = cri.normalise('crictl', {}, [], {})
    assert result['runtime_ready'] is False
    assert result['conditions'] == {}
    assert result['default_runtime_name'] == ''
    assert result['runtimes'] == {}
    assert result['enable_cdi'] is None  # 1.6 does not report CDI at all
    assert result['runtime_version'] == ''


def test_normalise_null_runtime():
    config = {'containerd': {'defaultRuntimeName': 'x', 'runtimes': {'x': None, 'y': {'options': 'odd'}}}}
    assert cri.normalise('grpc', VERSION, [], config)['runtimes'] == {
        'x': {'runtime_type': '', 'runtime_path': '', 'options': {}},
        'y': {'runtime_type': '', 'runtime_path': '', 'options': {}}}


@pytest.mark.parametrize('config', [{'containerd': 'odd'}, {'containerd': {'runtimes': ['a']}}])
def test_normalise_odd_shapes(config):
    assert cri.normalise('grpc', VERSION, [], config)['runtimes'] == {}


@pytest.mark.parametrize('raw,expected', [(None, {}), ('{"a": 1}', {'a': 1}), ({'a': 1}, {'a': 1})])
def test_cri_config(raw, expected):
    assert cri._cri_config(raw) == expected  # pylint: disable=protected-access


@pytest.mark.parametrize('raw,message', [('{not json', 'is not JSON'), ('[1, 2]', 'not a JSON object')])
def test_cri_config_bad(raw, message):
    with pytest.raises(cri.CriError, match=message) as err:
        cri._cri_config(raw)  # pylint: disable=protected-access
    assert err.value.kind == 'protocol'


# --- crictl output ----------------------------------------------------------------------------

CRICTL_VERSION = 'Version:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  v1.7.24\nRuntimeApiVersion:  v1\n'
CRICTL_INFO = {
    'status': {'conditions': [{'type': 'RuntimeReady', 'status': True, 'reason': '', 'message': ''}]},
    'config': CONFIG_17, 'golang': 'go1.24.4', 'lastCNILoadStatus': 'cni config load failed: ...',
    'runtimeHandlers': [{'name': 'nvidia', 'features': {}}, {'name': 'runc'}],
}


def test_crictl_version_text():
    assert cri.parse_crictl_version(CRICTL_VERSION) == {
        'version': '0.1.0', 'runtime_name': 'containerd', 'runtime_version': 'v1.7.24', 'runtime_api_version': 'v1'}


def test_crictl_version_json():
    text = json.dumps({'version': '0.1.0', 'runtimeName': 'containerd', 'runtimeVersion': '2.1.9',
                       'runtimeApiVersion': 'v1'})
    assert cri.parse_crictl_version(text)['runtime_version'] == '2.1.9'


@pytest.mark.parametrize('text', ['', 'garbage', 'Version: 0.1.0\n', '{"version": "x"', '[1]'])
def test_crictl_version_bad(text):
    with pytest.raises(ValueError):
        cri.parse_crictl_version(text)


def test_crictl_info():
    conditions, config, handlers = cri.parse_crictl_info(json.dumps(CRICTL_INFO))
    assert conditions == CRICTL_INFO['status']['conditions']
    assert config == CONFIG_17
    assert handlers == ['nvidia', 'runc']


def test_crictl_info_config_as_string():
    info = dict(CRICTL_INFO, config=json.dumps(CONFIG_17))
    del info['runtimeHandlers']
    conditions, config, handlers = cri.parse_crictl_info(json.dumps(info))
    assert config == CONFIG_17 and handlers == [] and len(conditions) == 1


@pytest.mark.parametrize('text,error', [
    ('not json', ValueError), ('[]', ValueError), ('{"status": {"conditions": {"a": 1}}}', ValueError),
    ('{"status": 5}', ValueError), ('{"status": {"conditions": [1]}}', ValueError),
    ('{"runtimeHandlers": 5}', ValueError), ('{"config": "{oops"}', cri.CriError),
    ('{"config": "[1]"}', cri.CriError),
])
def test_crictl_info_bad(text, error):
    with pytest.raises(error):
        cri.parse_crictl_info(text)


# --- crictl transport, with a stand-in crictl (the real one is not packaged for Debian) --------

@pytest.fixture
def fake_crictl(tmp_path, monkeypatch):
    """Writes an executable `crictl` that logs its arguments and prints canned output."""
    def make(info=None, version=CRICTL_VERSION, rc=0, stderr=''):
        (tmp_path / 'info.json').write_text(json.dumps(CRICTL_INFO if info is None else info))
        (tmp_path / 'version.txt').write_text(version)
        script = tmp_path / 'bin' / 'crictl'
        script.parent.mkdir(exist_ok=True)
        script.write_text(textwrap.dedent('''\
            #!/bin/sh
            echo "$@" >> {d}/args
            if [ {rc} -ne 0 ]; then echo '{stderr}' >&2; exit {rc}; fi
            case " $* " in
              *" info "*) cat {d}/info.json ;;
              *" version"*) cat {d}/version.txt ;;
            esac
            ''').format(d=tmp_path, rc=rc, stderr=stderr))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv('PATH', str(script.parent) + os.pathsep + os.environ.get('PATH', ''))
        return tmp_path / 'args'
    return make


@pytest.fixture
def unix_socket():
    path = '/tmp/gr-unit-%d.sock' % os.getpid()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    yield path
    sock.close()
    os.unlink(path)


def test_crictl_transport(fake_crictl, unix_socket):
    args = fake_crictl()
    result = cri.cri_status(unix_socket, transport='crictl', timeout=3)
    assert result['transport'] == 'crictl'
    assert result['default_runtime_name'] == 'nvidia'
    assert result['runtimes']['nvidia']['options']['BinaryName'] == '/usr/bin/nvidia-container-runtime'
    assert result['runtime_version'] == 'v1.7.24'
    assert result['runtime_ready'] is True
    calls = args.read_text().splitlines()
    assert calls == ['--runtime-endpoint unix://%s --timeout 3s version' % unix_socket,
                     '--runtime-endpoint unix://%s --timeout 3s info -o json' % unix_socket]


def test_auto_falls_back_to_crictl(fake_crictl, unix_socket, monkeypatch):
    fake_crictl()
    monkeypatch.setattr(cri, 'HAS_GRPC', False)
    assert cri.cri_status(unix_socket)['transport'] == 'crictl'


@pytest.mark.parametrize('stderr,kind', [
    ('rpc error: code = Unimplemented desc = unknown service runtime.v1.RuntimeService', 'unimplemented'),
    ('rpc error: code = DeadlineExceeded desc = context deadline exceeded', 'timeout'),
    ('rpc error: code = Unavailable desc = connection error', 'unavailable'),
    ('rpc error: code = Unknown desc = server is not initialized yet', 'initializing'),
    ('something else', 'error'),
])
def test_crictl_errors(fake_crictl, unix_socket, stderr, kind):
    fake_crictl(rc=1, stderr=stderr)
    with pytest.raises(cri.CriError) as err:
        cri.cri_status(unix_socket, transport='crictl')
    assert err.value.kind == kind
    assert unix_socket in str(err.value) and stderr in str(err.value)


def test_crictl_garbage(fake_crictl, unix_socket):
    fake_crictl(version='RuntimeName: containerd\n', info='{"status": {"conditions": 5}}')
    with pytest.raises(cri.CriError, match='unreadable crictl output') as err:
        cri.cri_status(unix_socket, transport='crictl')
    assert err.value.kind == 'protocol'


def test_crictl_missing(monkeypatch, tmp_path):
    monkeypatch.setenv('PATH', str(tmp_path))
    with pytest.raises(cri.CriError, match='crictl not found on PATH') as err:
        cri.cri_status('/run/containerd/containerd.sock', transport='crictl')
    assert err.value.kind == 'no-transport'


def test_grpc_missing(monkeypatch):
    monkeypatch.setattr(cri, 'HAS_GRPC', False)
    monkeypatch.setattr(cri, 'GRPC_IMPORT_ERROR', ImportError("No module named 'grpc'"))
    with pytest.raises(cri.CriError, match="grpcio is not importable .No module named 'grpc'") as err:
        cri.cri_status('/run/containerd/containerd.sock', transport='grpc')
    assert err.value.kind == 'no-transport'
    assert 'pip install grpcio' in str(err.value)


def test_bad_transport():
    with pytest.raises(ValueError, match='transport must be'):
        cri.cri_status('/x.sock', transport='http')
