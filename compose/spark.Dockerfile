# The Spark cluster's image (docker-compose.yml: master, workers, Spark Connect server): Java 17,
# the Airflow image's Python version (functions pickled by the driver in an Airflow task run on
# the executors), pyspark, and the executors' packages from requirements-cluster.txt. Nothing of
# Cairn: each job ships its code as an artifact (docs/operating.md, Running on your cluster), and
# spark_jobs.executors checks this Python when a job starts.
# Build context: the repository root (see docker-compose.yml); spark.Dockerfile.dockerignore
# sends only the three files below.

# Spark's Kafka and Iceberg connector jars, fetched from Maven Central as `make jars` does.
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY jars/spark/pom.xml /build/pom.xml
RUN mvn --batch-mode --quiet -f /build/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory=/build/spark

FROM eclipse-temurin:17-jre AS java

FROM python:3.11-slim-bookworm

COPY --from=java /opt/java/openjdk /opt/java/openjdk
ENV JAVA_HOME=/opt/java/openjdk
ENV PATH="${JAVA_HOME}/bin:${PATH}"

# pyspark brings Spark itself (its jars and spark-class, spark-submit); the same version as
# requirements.txt's, as the Kafka connector must match it.
COPY requirements-cluster.txt /tmp/requirements-cluster.txt
RUN pip install --no-cache-dir pyspark==4.0.0 -r /tmp/requirements-cluster.txt \
    && rm /tmp/requirements-cluster.txt

# The Spark Connect server's --jars, and its job scheduling (docker-compose.yml).
COPY --from=jars /build/spark /opt/spark-connectors
COPY jars/spark/fairscheduler.xml /opt/spark-conf/fairscheduler.xml

RUN useradd --create-home --uid 50000 spark
USER spark
WORKDIR /home/spark
