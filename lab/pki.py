# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's PKI: a CA, serving certificates (for the names and addresses given) and client certificates
(CN = user, O = groups, as the API server's x509 authenticator reads them). ECDSA P-256 keys: quick
to make on a small machine, and accepted by OpenSSL, Python's ssl and client-go alike."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path, data, mode):
    """Write data to path with mode, replacing any old file atomically."""
    tmp = path + '.tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'wb') as handle:
        handle.write(data)
    os.replace(tmp, path)


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CertificateAuthority:
    """A CA whose key stays in this process; issue() writes cert and key files."""

    def __init__(self, key, cert, cert_path):
        self.key = key
        self.cert = cert
        self.cert_path = cert_path

    @classmethod
    def create(cls, directory, common_name='gpuready-test-ca'):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        public = key.public_key()
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name).public_key(public)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
                .sign(key, hashes.SHA256()))
        cert_path = os.path.join(directory, 'ca.crt')
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(os.path.join(directory, 'ca.key'), _key_pem(key), 0o600)
        return cls(key, cert, cert_path)

    @classmethod
    def load(cls, directory):
        """The CA create() wrote into directory, to issue more certificates from another process."""
        cert_path = os.path.join(directory, 'ca.crt')
        with open(cert_path, 'rb') as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
        with open(os.path.join(directory, 'ca.key'), 'rb') as handle:
            key = serialization.load_pem_private_key(handle.read(), password=None)
        return cls(key, cert, cert_path)

    def issue(self, cert_path, key_path, common_name, organizations=(), server_names=None):
        """A leaf certificate: for a server when server_names (DNS names and IP addresses) is
        given, else a client certificate. Returns (cert_path, key_path)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name(attributes)).issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=365))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                key_cert_sign=False, crl_sign=False, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                                  critical=False))
        if server_names is not None:
            alt_names = []
            for entry in server_names:
                try:
                    alt_names.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alt_names.append(x509.DNSName(entry))
            builder = (builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(key_path, _key_pem(key), 0o600)
        return cert_path, key_path
