"""The jobs' Python workers import pyspark from the installed package, compiled,
not from the sources of its zip (cqsd/srds/workers.py)."""

import os
import sys

import pyspark

from cqsd.srds.workers import unzipped


def package(root, name):
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    return root / name


def test_the_installed_pysparks_own_zips_go_when_their_packages_are_installed(tmp_path):
    site = tmp_path / "site"
    lib = package(site, "pyspark") / "python" / "lib"
    package(site, "py4j")
    path = [str(lib / "py4j-0.10.9.9-src.zip"), str(lib / "pyspark.zip"), str(site),
            str(tmp_path / "other.zip")]
    assert unzipped(path) == [str(site), str(tmp_path / "other.zip")]


def test_a_zip_stays_when_its_package_is_not_installed_or_is_a_distributions(tmp_path):
    site = tmp_path / "site"
    lib = package(site, "pyspark") / "python" / "lib"
    spark_home = tmp_path / "spark" / "python" / "lib"
    path = [str(lib / "py4j-0.10.9.9-src.zip"), str(spark_home / "pyspark.zip"), str(site)]
    assert unzipped(path) == path  # no py4j installed; the other pyspark.zip is not ours
    assert unzipped([str(spark_home / "pyspark.zip")]) == [str(spark_home / "pyspark.zip")]


def test_a_jobs_workers_import_pyspark_from_the_installed_package(spark):
    def where(_):
        import pyspark as theirs

        yield theirs.__file__, [p for p in sys.path if p.endswith(".zip")]

    ((found, zips),) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found == pyspark.__file__
    assert not [z for z in zips if z.startswith(os.path.dirname(pyspark.__file__))]
