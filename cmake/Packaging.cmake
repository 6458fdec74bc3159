# Debian packages and RPMs with CPack, one package per install component. Made from a configured and built tree:
#
#   cpack -G DEB   (in the build dir; also -G RPM, which needs rpmbuild)
#
# component   Debian package           RPM package             what
# node        slurm-ckpt               slurm-ckpt              the SPANK plugin, the ckpt CLI, ckpt-run (every node)
# controller  slurm-ckpt-controller    slurm-ckpt-controller   ckpt-controller, unit, conffile
# python      python3-slurm-ckpt       python3-slurm-ckpt      the slurm_ckpt module for Debian's python3
# runtime     libckpt0                 slurm-ckpt-libs         libckpt.so.0, which the module and C/C++ programs load
# dev         libslurm-ckpt-dev        slurm-ckpt-devel        headers, libckpt.so, pkg-config, CMake config
#
# Packages are made from a /usr build (the top CMakeLists.txt's default prefix); the install rules put every file
# where Debian puts it (GNUInstallDirs' multiarch libdir, Slurm's PluginDir, Debian's python3 dist-packages).
# CKPT_PACKAGE_VERSION_SUFFIX (or `cpack -D CPACK_PACKAGE_VERSION=...`) changes the version without a rebuild.
# packaging/README.md explains the choices and the lintian tags left.

set(CKPT_PACKAGE_VERSION_SUFFIX "" CACHE STRING "Appended to the project version in package versions (e.g. +site1)")
set(CKPT_PACKAGE_CONTACT "slurm-ckpt maintainers <slurm-ckpt@localhost>" CACHE STRING "Package maintainer")

if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "slurm-ckpt: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}; packages want a /usr build")
endif()

# Per-package documentation: copyright and the changelog, in each package's /usr/share/doc/<package>. The
# changelog names the version configured here (SOURCE_DATE_EPOCH, when set, fixes its date).
set(ckpt_pkg_dir ${PROJECT_BINARY_DIR}/packaging)
string(TIMESTAMP ckpt_changelog_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
file(WRITE ${ckpt_pkg_dir}/changelog.Debian
"slurm-ckpt (${PROJECT_VERSION}${CKPT_PACKAGE_VERSION_SUFFIX}-1) unstable; urgency=medium

  * Built with CPack from the slurm-ckpt sources (cmake/Packaging.cmake).

 -- ${CKPT_PACKAGE_CONTACT}  ${ckpt_changelog_date}
")
execute_process(COMMAND gzip -9n -c ${ckpt_pkg_dir}/changelog.Debian
                OUTPUT_FILE ${ckpt_pkg_dir}/changelog.Debian.gz)
set(ckpt_doc_files ${PROJECT_SOURCE_DIR}/packaging/copyright ${ckpt_pkg_dir}/changelog.Debian.gz)
foreach(ckpt_pkg slurm-ckpt slurm-ckpt-controller python3-slurm-ckpt libckpt0 libslurm-ckpt-dev)
  # The component of each Debian package name.
  if(ckpt_pkg STREQUAL "slurm-ckpt")
    set(ckpt_comp node)
  elseif(ckpt_pkg STREQUAL "slurm-ckpt-controller")
    set(ckpt_comp controller)
  elseif(ckpt_pkg STREQUAL "python3-slurm-ckpt")
    set(ckpt_comp python)
  elseif(ckpt_pkg STREQUAL "libckpt0")
    set(ckpt_comp runtime)
  else()
    set(ckpt_comp dev)
  endif()
  install(FILES ${ckpt_doc_files} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${ckpt_pkg}
          COMPONENT ${ckpt_comp} EXCLUDE_FROM_ALL)
endforeach()
# Admins' starting points, next to the package that uses them.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/host/plugstack.conf
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/slurm-ckpt/examples COMPONENT node EXCLUDE_FROM_ALL)

# ---- common -------------------------------------------------------------------------------------------------------
set(CPACK_PACKAGE_NAME slurm-ckpt)
set(CPACK_PACKAGE_VENDOR "slurm-ckpt")
set(CPACK_PACKAGE_CONTACT "${CKPT_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}${CKPT_PACKAGE_VERSION_SUFFIX}")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
# Absolute destinations (/etc, /lib/systemd, the python dir) land in the package, not on this machine.
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL node controller python runtime dev)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)

# Summary, then the extended description (lines under 80 columns, as Debian's control files want them).
set(CPACK_COMPONENT_NODE_DESCRIPTION "checkpoint and fast recovery of training jobs on Slurm: plugin and CLI
The SPANK plugin spank_ckpt.so gives every job --ckpt-* options (interval,
dir, kept checkpoints, last words, MTBF, restart budget, grace before the
time limit), hands each rank its settings and the newest complete checkpoint
to resume from, and reports task failures to the recovery controller. The
ckpt tool lists, verifies and cleans checkpoint dirs and computes optimal
checkpoint intervals; ckpt-run relaunches a job step inside its allocation
or restarts it in place with spares. Install it on every node.")
set(CPACK_COMPONENT_CONTROLLER_DESCRIPTION "checkpoint and fast recovery of training jobs on Slurm: controller
ckpt-controller takes the plugin's failure reports, classifies each job's
ending and requeues failed jobs within seconds, away from bad nodes, with a
restart budget that resets only on checkpoint progress. Install it on one
host with the cluster's slurm.conf, such as the one that runs slurmctld.")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "checkpoint and fast recovery of training jobs on Slurm: Python module
The slurm_ckpt module (and slurm_ckpt.torch for PyTorch) takes asynchronous
two-phase checkpoints committed across ranks, resumes from the newest
complete one, and writes a terminal checkpoint at the time limit, on
preemption or when a peer dies.")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "checkpoint and fast recovery of training jobs on Slurm: hooks library
libckpt is the library that training programs and the Python module load:
asynchronous checkpoints of the program's memory, their commit across ranks
and the restore of the newest complete checkpoint.")
set(CPACK_COMPONENT_DEV_DESCRIPTION "checkpoint and fast recovery of training jobs on Slurm: development files
Headers of libckpt's C API (ckpt.h) and C++ API (ckpt/hooks.hpp), the
libckpt.so link, a pkg-config file (slurm-ckpt) and a CMake package config:
find_package(slurm_ckpt) gives the imported target slurm_ckpt::ckpt.")

# ---- Debian -------------------------------------------------------------------------------------------------------
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libckpt.so.0 is in this build, not yet in a package on this machine: dpkg-shlibdeps finds it here, and the
# packages that load it depend on libckpt0 of the same version (CPACK_PROJECT_CONFIG_FILE).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/hooks)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_DEBIAN_NODE_PACKAGE_NAME slurm-ckpt)
set(CPACK_DEBIAN_CONTROLLER_PACKAGE_NAME slurm-ckpt-controller)
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-slurm-ckpt)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libckpt0)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libslurm-ckpt-dev)
set(CPACK_DEBIAN_NODE_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_CONTROLLER_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The shlibs file of libckpt0 (the one package with a versioned shared library), so that other packages'
# dpkg-shlibdeps find it; the dynamic linker's cache is refreshed by a trigger, not by maintainer scripts.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/runtime/triggers
    ${PROJECT_SOURCE_DIR}/packaging/debian/runtime/postinst ${PROJECT_SOURCE_DIR}/packaging/debian/runtime/postrm)

# Slurm refuses a SPANK plugin built for another release (plugin_version), and the controller links libslurm:
# both need the Slurm release they were built against, major.minor.
set(ckpt_slurm_version "")
if(EXISTS "${SLURM_INCLUDE_DIR}/slurm/slurm_version.h")  # SLURM_INCLUDE_DIR: found by spank/ and controller/
  file(STRINGS "${SLURM_INCLUDE_DIR}/slurm/slurm_version.h" ckpt_slurm_version REGEX "^#define SLURM_VERSION_NUMBER")
endif()
if(ckpt_slurm_version MATCHES "0x([0-9a-fA-F][0-9a-fA-F])([0-9a-fA-F][0-9a-fA-F])")
  math(EXPR ckpt_slurm_major "0x${CMAKE_MATCH_1}")
  math(EXPR ckpt_slurm_minor "0x${CMAKE_MATCH_2}")
  set(ckpt_slurm_release "${ckpt_slurm_major}.")
  if(ckpt_slurm_minor LESS 10)
    string(APPEND ckpt_slurm_release "0")
  endif()
  string(APPEND ckpt_slurm_release "${ckpt_slurm_minor}")
  math(EXPR ckpt_slurm_next_minor "${ckpt_slurm_minor} + 1")
  set(ckpt_slurm_next "${ckpt_slurm_major}.")
  if(ckpt_slurm_next_minor LESS 10)
    string(APPEND ckpt_slurm_next "0")
  endif()
  string(APPEND ckpt_slurm_next "${ckpt_slurm_next_minor}")
  set(CKPT_SLURM_DEPENDS "slurm-client (>= ${ckpt_slurm_release}), slurm-client (<< ${ckpt_slurm_next})")
else()
  set(CKPT_SLURM_DEPENDS "slurm-client")
endif()

# The Python the module was built for: its ABI is in the module's file name (cpython-3XY).
execute_process(COMMAND ${CKPT_PYTHON} -c "import sys; print('%d.%d' % sys.version_info[:2])"
                OUTPUT_VARIABLE ckpt_py_version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(ckpt_py_version MATCHES "^3\\.([0-9]+)$")
  math(EXPR ckpt_py_next "${CMAKE_MATCH_1} + 1")
  set(CKPT_PYTHON_DEPENDS "python3 (>= ${ckpt_py_version}), python3 (<< 3.${ckpt_py_next})")
else()
  set(CKPT_PYTHON_DEPENDS "python3")
endif()

set(CPACK_DEBIAN_NODE_PACKAGE_DEPENDS "${CKPT_SLURM_DEPENDS}")
set(CPACK_DEBIAN_NODE_PACKAGE_ENHANCES "slurmd")
set(CPACK_DEBIAN_CONTROLLER_PACKAGE_DEPENDS "${CKPT_SLURM_DEPENDS}")
set(CPACK_DEBIAN_CONTROLLER_PACKAGE_RECOMMENDS "munge, slurm-ckpt")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "python3-torch")
# The controller's maintainer scripts (state dir, systemd) and its conffile list.
set(CPACK_DEBIAN_CONTROLLER_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/controller/conffiles
    ${PROJECT_SOURCE_DIR}/packaging/debian/controller/postinst
    ${PROJECT_SOURCE_DIR}/packaging/debian/controller/prerm
    ${PROJECT_SOURCE_DIR}/packaging/debian/controller/postrm)
# Inter-package dependencies name the version being packed, which `cpack -D CPACK_PACKAGE_VERSION=...` may change.
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/CkptCPackProject.cmake)
file(WRITE ${CPACK_PROJECT_CONFIG_FILE} "# Generated by cmake/Packaging.cmake: read by cpack for each generator.
set(ckpt_v \"\${CPACK_PACKAGE_VERSION}-\${CPACK_DEBIAN_PACKAGE_RELEASE}\")
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS \"libckpt0 (= \${ckpt_v}), ${CKPT_PYTHON_DEPENDS}\")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS \"libckpt0 (= \${ckpt_v}), nlohmann-json3-dev (>= 3)\")
set(CPACK_RPM_PYTHON_PACKAGE_REQUIRES \"slurm-ckpt-libs = \${CPACK_PACKAGE_VERSION}\")
set(CPACK_RPM_DEV_PACKAGE_REQUIRES \"slurm-ckpt-libs = \${CPACK_PACKAGE_VERSION}\")
")

# ---- RPM (for RHEL-family clusters; rpmbuild, from Debian's rpm package, builds it here) ---------------------------
# Built from this tree, the RPMs carry this tree's layout; packaging/README.md says what a RHEL build changes.
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_RELEASE 1)
set(CPACK_RPM_PACKAGE_LICENSE "Apache-2.0")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Base")
foreach(ckpt_comp node controller python runtime dev)
  # The summary is the first line of the component's description.
  string(TOUPPER ${ckpt_comp} ckpt_COMP)
  string(REGEX REPLACE "\n.*" "" CPACK_RPM_${ckpt_COMP}_PACKAGE_SUMMARY "${CPACK_COMPONENT_${ckpt_COMP}_DESCRIPTION}")
endforeach()
set(CPACK_RPM_NODE_PACKAGE_NAME slurm-ckpt)
set(CPACK_RPM_CONTROLLER_PACKAGE_NAME slurm-ckpt-controller)
set(CPACK_RPM_PYTHON_PACKAGE_NAME python3-slurm-ckpt)
set(CPACK_RPM_RUNTIME_PACKAGE_NAME slurm-ckpt-libs)
set(CPACK_RPM_DEV_PACKAGE_NAME slurm-ckpt-devel)
set(CPACK_PACKAGE_RELOCATABLE OFF)  # absolute paths (/etc, /lib/systemd): not relocatable
# No /usr/lib/.build-id links: two of these packages would own the same ones.
set(CPACK_RPM_SPEC_MORE_DEFINE "%define _build_id_links none")
set(CPACK_RPM_CONTROLLER_USER_FILELIST "%config(noreplace) %attr(0640,root,root) /etc/slurm-ckpt/controller.conf")
set(CPACK_RPM_CONTROLLER_POST_INSTALL_SCRIPT_FILE ${PROJECT_SOURCE_DIR}/packaging/rpm/controller-post.sh)
# Directories other packages own (filesystem, systemd, python3) stay out of ours.
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
    /etc /lib /lib/systemd /lib/systemd/system /usr/bin /usr/sbin /usr/${CMAKE_INSTALL_LIBDIR} /usr/${CMAKE_INSTALL_LIBDIR}/pkgconfig
    /usr/${CMAKE_INSTALL_LIBDIR}/cmake /usr/lib/python3 /usr/lib/python3/dist-packages /usr/share/man
    /usr/share/man/man1 /usr/share/man/man8 /usr/share/doc /usr/${CMAKE_INSTALL_LIBDIR}/slurm-wlm /usr/include)

include(CPack)
