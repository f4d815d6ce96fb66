"""Encoding detection on real bytes: each codec is written with str.encode and must decode to the same text."""

from __future__ import annotations

import random

import pytest

from pipeline.ingest.encoding import (
    FileDecoder,
    UndecodableError,
    bom_encoding,
    decode_bytes,
    detect,
    is_line_safe,
)

CHINESE = (
    "Debian 是一个自由的操作系统，由遍布世界各地的志愿者共同开发和维护。软件包管理系统负责安装、升级和删除软件，"
    "并自动处理软件包之间的依赖关系。系统管理员可以使用命令行工具来配置网络、用户账户以及各种服务。"
    "本手册介绍了系统初始化、文件系统、网络设置和数据管理等主题，希望对新用户和有经验的用户都有所帮助。\n"
)
JAPANESE = (
    "Debian はボランティアによって開発されている自由なオペレーティングシステムです。パッケージ管理システムは"
    "ソフトウェアのインストールや更新、削除を行い、パッケージ間の依存関係を自動的に解決します。"
    "システム管理者はコマンドラインのツールを使って、ネットワークやユーザーアカウント、各種サービスを設定できます。"
    "この文書では、システムの初期化、ファイルシステム、ネットワークの設定について説明します。\n"
)
FRENCH = (
    "Debian est un système d’exploitation libre, développé et maintenu par des bénévoles répartis dans le monde "
    "entier. Le système de gestion des paquets installe, met à jour et supprime les logiciels, et résout "
    "automatiquement les dépendances entre les paquets. L’administrateur peut configurer le réseau, les comptes "
    "et les services grâce à des outils en ligne de commande. Ce manuel décrit l’initialisation du système, "
    "les systèmes de fichiers, la configuration du réseau et la gestion des données — « à lire sans modération ».\n"
)
SPANISH = (
    "Debian es un sistema operativo libre, desarrollado y mantenido por voluntarios de todo el mundo. El sistema "
    "de gestión de paquetes instala, actualiza y elimina programas, y resuelve automáticamente las dependencias. "
    "¿Qué hace el administrador? Configura la red, las cuentas de usuario y los servicios con herramientas de la "
    "línea de órdenes. Este manual describe la inicialización del sistema y la gestión de datos en español.\n"
)
RUSSIAN = (
    "Debian — это свободная операционная система, которую разрабатывают и поддерживают добровольцы со всего "
    "мира. Система управления пакетами устанавливает, обновляет и удаляет программы, а также автоматически "
    "разрешает зависимости между пакетами. Администратор настраивает сеть, учётные записи и службы с помощью "
    "инструментов командной строки.\n"
)


def test_utf8_is_the_fast_path() -> None:
    text = "plain ASCII, then UTF-8: naïve café, 中文, 日本語\n"
    got = decode_bytes(text.encode("utf-8"))
    assert (got.text, got.encoding, got.confidence) == (text, "utf-8", 1.0)


@pytest.mark.parametrize(
    ("codec", "expected"),
    [("utf-8-sig", "utf-8"), ("utf-16", "utf-16"), ("utf-16-be", "utf-16"), ("utf-32", "utf-32")],
)
def test_byte_order_marks(codec: str, expected: str) -> None:
    data = CHINESE.encode(codec)
    if codec == "utf-16-be":  # Python writes no BOM for the explicit-endian codec
        data = b"\xfe\xff" + data
    got = decode_bytes(data)
    assert got.text == CHINESE  # the BOM is not part of the text
    assert got.encoding == expected


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        (CHINESE, "gbk"),
        (CHINESE + "𠀀𠀁 — 4-byte GB18030 sequences.\n", "gb18030"),
        (JAPANESE, "shift_jis"),
        (JAPANESE, "cp932"),
        (FRENCH, "cp1252"),
        (SPANISH, "latin-1"),
        (RUSSIAN, "cp1251"),
    ],
)
def test_legacy_codecs_are_detected(text: str, codec: str) -> None:
    data = text.encode(codec)
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")  # really not UTF-8, so detection ran
    got = decode_bytes(data)
    assert got.text == text
    assert got.encoding != "utf-8"
    assert 0.8 <= got.confidence <= 1.0


def test_shift_jis_keeps_the_standard_wave_dash_and_cp932_extensions() -> None:
    standard = JAPANESE + "「〜しましょう。」\n"  # 0x8160: U+301C in Shift_JIS, U+FF5E in CP932
    assert decode_bytes(standard.encode("shift_jis")).text == standard
    windows = JAPANESE + "手順①と②を参照してください。\n"  # NEC circled digits: CP932 only
    got = decode_bytes(windows.encode("cp932"))
    assert (got.text, got.encoding) == (windows, "cp932")


def test_random_bytes_are_undecodable() -> None:
    data = random.Random(0).randbytes(4096)
    with pytest.raises(UndecodableError):
        decode_bytes(data)


def test_bad_bytes_after_a_bom_are_undecodable() -> None:
    with pytest.raises(UndecodableError, match="byte-order mark"):
        decode_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")  # lone surrogate


def test_file_decoder_reuses_the_detected_codec() -> None:
    decoder = FileDecoder()
    first = decoder.decode(CHINESE.encode("gb18030"))
    assert first.text == CHINESE and decoder.fallback == "gb18030"
    short = "中文".encode("gb18030")  # too short to detect on its own; the file's codec decodes it
    assert decoder.decode(short).text == "中文"
    assert decoder.decode(b"ascii line\n").encoding == "utf-8"


def test_bom_and_line_safety() -> None:
    assert bom_encoding(b"\xef\xbb\xbfabc") == "utf-8-sig"
    assert bom_encoding(b"\xff\xfe\x00\x00") == "utf-32"
    assert bom_encoding(b"\xff\xfea\x00") == "utf-16"
    assert bom_encoding(b"abc") is None
    assert is_line_safe("utf-8") and is_line_safe("gb18030") and is_line_safe("shift_jis")
    assert not is_line_safe("utf-16") and not is_line_safe("UTF-32")


def test_detect_validates_confidence() -> None:
    with pytest.raises(ValueError, match="min_confidence"):
        detect(b"abc", min_confidence=1.5)
