# The image of every Airflow component. Its tasks are Spark clients: Spark Connect sessions, and
# spark-submit drivers (Java, pyspark, the connector jars they ship) for the cluster of
# compose/spark.Dockerfile, whose Python must be this one's version.
# Build context: the repository root (see docker-compose.yml).

# Spark's Kafka connector jars, fetched from Maven Central as `make jars` does.
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY jars/spark/pom.xml /build/pom.xml
RUN mvn --batch-mode --quiet -f /build/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory=/build/spark

FROM apache/airflow:3.3.2-python3.11

USER root
# A headless JRE for spark-submit drivers (Java 17 on Debian bookworm; Spark 4.0 also runs on 21,
# which is the default on newer Debian releases).
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java

USER airflow
COPY --chown=airflow:root requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/requirements.txt

# Where cairn_stack.settings (jars_dir) looks for them.
COPY --from=jars --chown=airflow:root /build/spark /opt/airflow/.cairn/jars/spark
ENV CAIRN_JARS_DIR=/opt/airflow/.cairn/jars
