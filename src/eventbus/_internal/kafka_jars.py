"""The Apache Kafka release a local broker runs: its jars, resolved from Maven Central, and Java.

The POM shipped beside this module lists ``org.apache.kafka:kafka_2.13`` and a log4j binding;
:func:`kafka_classpath` resolves them once with Maven into a cache outside any checkout
(``$EVENTBUS_KAFKA_HOME``, default ``~/.cache/eventbus/kafka-<version>``). Java 17 or newer
runs it (:func:`java`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from eventbus.errors import StackError

__all__ = ["KAFKA_VERSION", "java", "kafka_classpath"]

#: The Apache Kafka release the POM names (``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.1.1"
_JAVA_MIN = 17


def _cache_dir() -> Path:
    env = os.environ.get("EVENTBUS_KAFKA_HOME")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "eventbus" / f"kafka-{KAFKA_VERSION}"


def java() -> str:
    """The ``java`` executable (``$JAVA_HOME`` or ``PATH``), checked to be Java 17 or newer.

    Raises:
        StackError: none is found, or it is older (naming the fix).
    """
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        msg = (
            f"Apache Kafka needs Java {_JAVA_MIN} or newer and none was found (JAVA_HOME, PATH); "
            "install one (Debian: apt-get install openjdk-17-jre-headless), or run the embedded "
            "Tansu broker instead (eventbus up --broker tansu)"
        )
        raise StackError(msg)
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):  # "1.8.0": Java 8
        major = int(m.group(2))
    if major < _JAVA_MIN:
        msg = (
            f"Apache Kafka {KAFKA_VERSION} needs Java {_JAVA_MIN} or newer; {java} is Java "
            f"{major or '(unknown)'}; set JAVA_HOME to a newer JDK"
        )
        raise StackError(msg)
    return java


def kafka_classpath(*, resolve: bool = True) -> str:
    """The broker's classpath: every jar of the resolved Kafka release.

    Args:
        resolve: resolve the jars with Maven when the cache lacks them (False: fail instead).

    Returns:
        The jars, joined with ``:``.

    Raises:
        StackError: the jars are not cached and cannot be resolved (no ``mvn``, Maven Central
            unreachable), naming the fix.
    """
    libs = _cache_dir() / "libs"
    done = _cache_dir() / ".resolved"
    if not done.exists():
        if not resolve:
            msg = f"Apache Kafka {KAFKA_VERSION} is not resolved in {libs}; run `make kafka`"
            raise StackError(msg)
        _resolve(libs)
        done.write_text(KAFKA_VERSION + "\n")
    jars = sorted(libs.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        done.unlink(missing_ok=True)
        msg = f"{libs} holds no kafka_2.13 jar; delete {_cache_dir()} and run `make kafka`"
        raise StackError(msg)
    return ":".join(str(j) for j in jars)


def _resolve(libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = (
            f"Apache Kafka {KAFKA_VERSION} is not in {libs} and there is no `mvn` to resolve it "
            "from Maven Central; install Maven (apt-get install maven) and run `make kafka`, or "
            "set EVENTBUS_KAFKA_HOME to a directory whose libs/ holds the broker's jars"
        )
        raise StackError(msg)
    libs.mkdir(parents=True, exist_ok=True)
    pom = resources.files("eventbus._internal").joinpath("kafka-pom.xml")
    with resources.as_file(pom) as pom_path:
        argv = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom_path),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            f"-Dkafka.version={KAFKA_VERSION}",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        msg = (
            f"resolving Apache Kafka {KAFKA_VERSION} from Maven Central failed (exit "
            f"{proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}\nfix: check that Maven "
            "Central is reachable (~/.m2/settings.xml mirrors, proxies), then run `make kafka`"
        )
        raise StackError(msg)
