# Installs the libraries, public headers and a CMake package usable with find_package(actorpipe),
# all in the install component "development" (cmake --install <build> --component development);
# programs install with the default component.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(libs GLOBAL PROPERTY ACTORPIPE_LIBRARIES)
install(TARGETS ${libs} actorpipe_build_flags EXPORT actorpipeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/actorpipe)
foreach(dir kernels engine transport actors)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/actorpipe/${dir}
    COMPONENT development
    FILES_MATCHING PATTERN "*.hpp" PATTERN "internal" EXCLUDE PATTERN "*.test.*" EXCLUDE
    PATTERN "api" EXCLUDE)
endforeach()
# The public API: <actorpipe/trainer.hpp> and its siblings (include/actorpipe/*.hpp; the module
# headers they include sit beside them in include/actorpipe/<module>/).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/actors/api/actorpipe/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/actorpipe
  COMPONENT development FILES_MATCHING PATTERN "*.hpp" PATTERN "*.test.*" EXCLUDE)
install(EXPORT actorpipeTargets NAMESPACE actorpipe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/actorpipe
  COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/actorpipeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/actorpipeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/actorpipe)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/actorpipeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/actorpipeConfig.cmake ${PROJECT_BINARY_DIR}/actorpipeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/actorpipe COMPONENT development)
