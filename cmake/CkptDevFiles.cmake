# The files that let C and C++ training programs build against an installed libckpt (component dev):
#   pkg-config:  pkg-config --cflags --libs slurm-ckpt
#   CMake:       find_package(slurm_ckpt 0.1 REQUIRED)  then  target_link_libraries(app PRIVATE slurm_ckpt::ckpt)
# Included from hooks/CMakeLists.txt, where the library target is defined.
include(CMakePackageConfigHelpers)

set(CKPT_CMAKE_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/slurm_ckpt)
set(ckpt_dev_dir ${PROJECT_BINARY_DIR}/dev-files)

# The pkg-config file names paths under ${prefix}, so that it follows the install prefix.
configure_file(${PROJECT_SOURCE_DIR}/packaging/slurm-ckpt.pc.in ${ckpt_dev_dir}/slurm-ckpt.pc @ONLY)

# The CMake config computes every path from its own location (PACKAGE_PREFIX_DIR): relocatable.
configure_package_config_file(${PROJECT_SOURCE_DIR}/packaging/slurm_ckptConfig.cmake.in
  ${ckpt_dev_dir}/slurm_ckptConfig.cmake
  INSTALL_DESTINATION ${CKPT_CMAKE_CONFIG_DIR}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
# 0.x: every minor version may change the ABI (the soname is the major version, 0).
write_basic_package_version_file(${ckpt_dev_dir}/slurm_ckptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)

install(FILES ${ckpt_dev_dir}/slurm-ckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
install(FILES ${ckpt_dev_dir}/slurm_ckptConfig.cmake ${ckpt_dev_dir}/slurm_ckptConfigVersion.cmake
        DESTINATION ${CKPT_CMAKE_CONFIG_DIR} COMPONENT dev)
